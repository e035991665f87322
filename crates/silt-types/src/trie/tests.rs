use proptest::prelude::*;

use super::*;
use crate::topic::{TopicName, filter_matches};

fn filt(s: &str) -> TopicFilter {
    TopicFilter::new(s).unwrap()
}

fn matched(trie: &TopicTrie<u32>, name: &str) -> Vec<u32> {
    let mut v: Vec<u32> = trie.matches(name).into_iter().map(|(_, v)| *v).collect();
    v.sort();
    v
}

#[test]
fn multi_level_wildcard_matches_parent_and_children() {
    let mut t = TopicTrie::new();
    t.insert(&filt("a/#"), 1);
    t.insert(&filt("a/+"), 2);
    t.insert(&filt("a"), 3);
    t.insert(&filt("#"), 4);
    assert_eq!(matched(&t, "a"), vec![1, 3, 4]);
    assert_eq!(matched(&t, "a/b"), vec![1, 2, 4]);
    assert_eq!(matched(&t, "a/b/c"), vec![1, 4]);
    assert_eq!(matched(&t, "b"), vec![4]);
}

#[test]
fn dollar_topics_need_a_literal_first_level() {
    let mut t = TopicTrie::new();
    t.insert(&filt("#"), 1);
    t.insert(&filt("+/x"), 2);
    t.insert(&filt("$SYS/#"), 3);
    assert_eq!(matched(&t, "$SYS/x"), vec![3]);
}

#[test]
fn reports_the_filter_that_matched() {
    let mut t = TopicTrie::new();
    t.insert(&filt("a/+/c"), 1);
    t.insert(&filt("a/#"), 2);
    let mut got: Vec<String> = t.matches("a/b/c").into_iter().map(|(f, _)| f).collect();
    got.sort();
    assert_eq!(got, vec!["a/#".to_string(), "a/+/c".to_string()]);
}

#[test]
fn remove_prunes_and_reports() {
    let mut t = TopicTrie::new();
    assert!(t.insert(&filt("a/b/c"), 1));
    assert!(!t.insert(&filt("a/b/c"), 1));
    assert!(t.insert(&filt("a/b/#"), 1));
    assert_eq!(t.len(), 2);
    assert!(t.remove(&filt("a/b/c"), &1));
    assert!(!t.remove(&filt("a/b/c"), &1));
    assert!(t.remove(&filt("a/b/#"), &1));
    assert!(t.is_empty());
    assert!(t.root.children.is_empty());
}

fn level() -> impl Strategy<Value = String> {
    prop_oneof![Just("a".to_string()), Just("b".to_string()), Just(String::new()), Just("$s".to_string())]
}

fn name_strategy() -> impl Strategy<Value = String> {
    prop::collection::vec(level(), 1..5).prop_map(|l| l.join("/")).prop_filter("not empty", |n| !n.is_empty())
}

fn filter_strategy() -> impl Strategy<Value = String> {
    let lvl = prop_oneof![3 => level(), 2 => Just("+".to_string())];
    (prop::collection::vec(lvl, 1..5), any::<bool>())
        .prop_map(|(mut l, hash)| {
            if hash {
                l.push("#".into());
            }
            l.join("/")
        })
        .prop_filter("not empty", |f| !f.is_empty())
}

proptest! {
    #[test]
    fn trie_agrees_with_spec_matcher(
        filters in prop::collection::vec(filter_strategy(), 1..40),
        names in prop::collection::vec(name_strategy(), 1..20),
    ) {
        let mut t = TopicTrie::new();
        for (i, f) in filters.iter().enumerate() {
            t.insert(&filt(f), i);
        }
        for n in &names {
            TopicName::new(n.clone()).unwrap();
            let mut got: Vec<usize> = t.matches(n).into_iter().map(|(_, v)| *v).collect();
            got.sort();
            let want: Vec<usize> =
                filters.iter().enumerate().filter(|(_, f)| filter_matches(f, n)).map(|(i, _)| i).collect();
            prop_assert_eq!(got, want, "name {:?}", n);
        }
    }
}
