//! MQTT topic names and topic filters (MQTT 5.0 §4.7, identical in 3.1.1).
//!
//! A *name* is what a message is published to: no wildcards. A *filter* is what a subscription
//! names: `+` matches exactly one level, `#` (last level only) matches the parent level and any
//! number of levels below it, so `a/#` matches `a`. Filters that start with a wildcard never
//! match names starting with `$` (`$SYS/...`). Levels may be empty (`a//b`, `/a`).
//!
//! [`filter_matches`] is the reference matcher, written straight from the spec; the
//! [`TopicTrie`](crate::TopicTrie) must agree with it (a property test holds them together).

use std::fmt;

/// Longest topic name or filter in bytes (an MQTT UTF-8 string has a two-byte length).
pub const MAX_TOPIC_LEN: usize = 65_535;

/// Most levels a topic name or filter can have: a 65,535-byte topic of one-byte levels.
pub const MAX_TOPIC_LEVELS: usize = MAX_TOPIC_LEN / 2 + 1;

/// How many levels `topic` (a name or a filter) has: `a/b/c` has 3, `/` has 2.
pub fn level_count(topic: &str) -> usize {
    topic.bytes().filter(|&b| b == b'/').count() + 1
}

/// Why a string is not a valid topic name or filter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    #[error("topic is empty")]
    Empty,
    #[error("topic is longer than {MAX_TOPIC_LEN} bytes")]
    TooLong,
    #[error("topic contains the null character")]
    Null,
    #[error("topic name contains a wildcard ('+' or '#')")]
    WildcardInName,
    #[error("'+' must occupy a whole level")]
    BadSingleLevelWildcard,
    #[error("'#' must be the last level and occupy it whole")]
    BadMultiLevelWildcard,
}

fn check_common(s: &str) -> Result<(), TopicError> {
    if s.is_empty() {
        return Err(TopicError::Empty);
    }
    if s.len() > MAX_TOPIC_LEN {
        return Err(TopicError::TooLong);
    }
    if s.contains('\0') {
        return Err(TopicError::Null);
    }
    Ok(())
}

/// A validated topic name (no wildcards).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicName(String);

impl TopicName {
    pub fn new(s: impl Into<String>) -> Result<Self, TopicError> {
        let s = s.into();
        check_common(&s)?;
        if s.contains(['+', '#']) {
            return Err(TopicError::WildcardInName);
        }
        Ok(Self(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The levels of the name, split on `/`.
    pub fn levels(&self) -> std::str::Split<'_, char> {
        self.0.split('/')
    }
}

impl fmt::Debug for TopicName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for TopicName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A validated topic filter (wildcards allowed where the spec allows them).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicFilter(String);

impl TopicFilter {
    pub fn new(s: impl Into<String>) -> Result<Self, TopicError> {
        let s = s.into();
        check_common(&s)?;
        let mut levels = s.split('/').peekable();
        while let Some(level) = levels.next() {
            if level.contains('+') && level != "+" {
                return Err(TopicError::BadSingleLevelWildcard);
            }
            if level.contains('#') && (level != "#" || levels.peek().is_some()) {
                return Err(TopicError::BadMultiLevelWildcard);
            }
        }
        Ok(Self(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// True when the filter contains `+` or `#`.
    pub fn has_wildcard(&self) -> bool {
        self.0.contains(['+', '#'])
    }

    pub fn levels(&self) -> std::str::Split<'_, char> {
        self.0.split('/')
    }

    /// Does this filter match `name`?
    pub fn matches(&self, name: &TopicName) -> bool {
        filter_matches(self.as_str(), name.as_str())
    }
}

impl fmt::Debug for TopicFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for TopicFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The spec's matching rule, level by level, for an already valid filter and name.
pub fn filter_matches(filter: &str, name: &str) -> bool {
    if name.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut f = filter.split('/');
    let mut n = name.split('/');
    loop {
        match (f.next(), n.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(fl), Some(nl)) if fl == nl => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(f: &str, n: &str) -> bool {
        filter_matches(TopicFilter::new(f).unwrap().as_str(), TopicName::new(n).unwrap().as_str())
    }

    #[test]
    fn spec_examples_match() {
        assert!(m("sport/tennis/player1/#", "sport/tennis/player1"));
        assert!(m("sport/tennis/player1/#", "sport/tennis/player1/ranking"));
        assert!(m("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon"));
        assert!(m("sport/#", "sport"));
        assert!(m("#", "sport/tennis"));
        assert!(m("sport/tennis/+", "sport/tennis/player1"));
        assert!(!m("sport/tennis/+", "sport/tennis/player1/ranking"));
        assert!(!m("sport/+", "sport"));
        assert!(m("sport/+", "sport/"));
        assert!(m("+/+", "/finance"));
        assert!(m("/+", "/finance"));
        assert!(!m("+", "/finance"));
        assert!(m("+", "a"));
        assert!(m("a//b", "a//b"));
        assert!(m("a/+/b", "a//b"));
    }

    #[test]
    fn wildcard_filters_skip_dollar_topics() {
        assert!(!m("#", "$SYS/broker"));
        assert!(!m("+/monitor/Clients", "$SYS/monitor/Clients"));
        assert!(m("$SYS/#", "$SYS/monitor/Clients"));
        assert!(m("$SYS/monitor/+", "$SYS/monitor/Clients"));
    }

    #[test]
    fn levels_are_counted_like_the_spec_splits_them() {
        assert_eq!(level_count("a"), 1);
        assert_eq!(level_count("a/b/c"), 3);
        assert_eq!(level_count("/"), 2);
        assert_eq!(level_count("a//b/#"), 4);
        assert_eq!(level_count(&vec!["x"; MAX_TOPIC_LEVELS].join("/")), MAX_TOPIC_LEVELS);
    }

    #[test]
    fn invalid_filters_and_names_are_refused() {
        assert_eq!(TopicFilter::new(""), Err(TopicError::Empty));
        assert_eq!(TopicFilter::new("a/b#"), Err(TopicError::BadMultiLevelWildcard));
        assert_eq!(TopicFilter::new("a/#/b"), Err(TopicError::BadMultiLevelWildcard));
        assert_eq!(TopicFilter::new("a+/b"), Err(TopicError::BadSingleLevelWildcard));
        assert_eq!(TopicName::new("a/+"), Err(TopicError::WildcardInName));
        assert_eq!(TopicName::new("a\0b"), Err(TopicError::Null));
        assert!(TopicFilter::new("+/+/#").is_ok());
    }
}
