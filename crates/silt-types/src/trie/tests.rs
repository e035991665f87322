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

/// A client chooses how deep its topics go (a 65,535-byte topic has 32,768 levels): no
/// operation may recurse per level, or a deep enough topic overflows the stack.
#[test]
fn topics_tens_of_thousands_of_levels_deep_never_overflow_the_stack() {
    let deep = vec!["x"; 32_767].join("/"); // with "/#", the longest filter there is
    let deep_filter = format!("{deep}/#");
    // A small stack makes a per-level recursion fail at a few hundred levels, not thousands.
    std::thread::Builder::new()
        .stack_size(64 * 1024)
        .spawn(move || {
            let mut t = TopicTrie::new();
            assert!(t.insert(&filt(&deep), 1));
            assert!(t.insert(&filt(&deep_filter), 2));
            assert!(t.insert(&filt("x/+/#"), 3));
            assert_eq!(matched(&t, &deep), vec![1, 2, 3]);
            assert!(t.remove(&filt(&deep), &1));
            assert_eq!(matched(&t, &deep), vec![2, 3]);
            assert!(t.remove(&filt(&deep_filter), &2));
            assert_eq!(t.len(), 1);
            assert_eq!(t.root.children.len(), 1, "the deep chain was pruned");
            // Dropping a deep trie is iterative too.
            let mut t2 = TopicTrie::new();
            t2.insert(&filt(&deep), 7);
            drop(t2);
        })
        .unwrap()
        .join()
        .expect("no stack overflow");
}

#[test]
fn remove_keeps_what_shares_the_path() {
    let mut t = TopicTrie::new();
    t.insert(&filt("a/b/c/d"), 1);
    t.insert(&filt("a/b"), 2);
    t.insert(&filt("a/x"), 3);
    assert!(t.remove(&filt("a/b/c/d"), &1));
    assert_eq!(matched(&t, "a/b"), vec![2]);
    assert_eq!(matched(&t, "a/x"), vec![3]);
    assert!(t.root.children.get("a").unwrap().children.get("b").unwrap().children.is_empty(), "c/d pruned below a/b");
    assert!(t.remove(&filt("a/b"), &2));
    assert!(t.remove(&filt("a/x"), &3));
    assert!(t.root.children.is_empty());
}

fn wide_level() -> impl Strategy<Value = String> {
    (0u8..12).prop_map(|i| char::from(b'a' + i).to_string())
}

proptest! {
    /// Twelve names per level: nodes pass from a short list of children to a hash map (more
    /// than `FEW`) as filters are added, and keep agreeing with the spec through removals.
    #[test]
    fn nodes_with_many_children_agree_with_spec_matcher_through_removals(
        filters in prop::collection::vec(
            (prop::collection::vec(prop_oneof![4 => wide_level(), 1 => Just("+".to_string())], 1..4), any::<bool>())
                .prop_map(|(mut l, hash)| {
                    if hash {
                        l.push("#".into());
                    }
                    l.join("/")
                }),
            1..80,
        ),
        names in prop::collection::vec(prop::collection::vec(wide_level(), 1..4).prop_map(|l| l.join("/")), 1..20),
        removed in prop::collection::vec(any::<bool>(), 80),
    ) {
        let mut t = TopicTrie::new();
        for (i, f) in filters.iter().enumerate() {
            t.insert(&filt(f), i);
        }
        for (i, f) in filters.iter().enumerate() {
            if removed[i] {
                prop_assert!(t.remove(&filt(f), &i));
            }
        }
        for n in &names {
            let mut got: Vec<usize> = t.matches(n).into_iter().map(|(_, v)| *v).collect();
            got.sort();
            let want: Vec<usize> = filters
                .iter()
                .enumerate()
                .filter(|(i, f)| !removed[*i] && filter_matches(f, n))
                .map(|(i, _)| i)
                .collect();
            prop_assert_eq!(got, want, "name {:?}", n);
        }
        for (i, f) in filters.iter().enumerate() {
            if !removed[i] {
                prop_assert!(t.remove(&filt(f), &i));
            }
        }
        prop_assert!(t.is_empty() && t.root.children.is_empty(), "every node pruned");
    }
}

/// A node is its three lists, 16 bytes each, and no more: the map of a node with many children
/// is boxed (and fits beside the short list's pointer), so the nodes of a per-device level,
/// which a big map holds, stay small. The dispatcher's values are 16 bytes: its boxed node is
/// 48 and a short list's entry 64, each exactly an allocator size class.
#[test]
fn a_node_is_the_size_of_its_three_lists() {
    assert_eq!(std::mem::size_of::<Children<u64>>(), std::mem::size_of::<Box<[u64]>>());
    assert_eq!(std::mem::size_of::<Node<[u64; 2]>>(), 48);
    assert_eq!(std::mem::size_of::<(Box<str>, Node<[u64; 2]>)>(), 64);
}

/// A value is held once per filter however often it is added, and the filters' lists hold
/// exactly their values (boxed slices: no spare room on any of the many nodes of one value).
#[test]
fn a_filter_holds_each_value_once() {
    let mut t = TopicTrie::new();
    assert!(t.insert(&filt("a/b"), 1u64));
    assert!(t.insert(&filt("a/#"), 2u64));
    assert!(!t.insert(&filt("a/b"), 1u64), "the same pair again");
    assert!(t.insert(&filt("a/b"), 3u64));
    assert_eq!(t.len(), 3);
    let a = t.root.children.get("a").unwrap();
    assert_eq!(&*a.hash, &[2]);
    assert_eq!(&*a.children.get("b").unwrap().values, &[1, 3]);
    assert!(t.remove(&filt("a/b"), &1));
    assert_eq!(&*t.root.children.get("a").unwrap().children.get("b").unwrap().values, &[3]);
}
