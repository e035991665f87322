//! Groups forming, rebalancing and losing members, as consumers see it.

use super::*;

fn three() -> [Consumer; 3] {
    [Consumer::new("c1"), Consumer::new("c2"), Consumer::new("c3")]
}

#[test]
fn three_members_on_a_three_partition_topic_form_one_generation_with_a_partition_each() {
    // Kafka's default initial delay: members arriving within it form one generation.
    let mut w = World::with(Settings { initial_rebalance_delay: Duration::from_secs(3), ..settings() });
    let [mut c1, mut c2, mut c3] = three();
    let t1 = w.join(&mut c1);
    assert!(c1.member_id.starts_with("c1-"), "assigned on MEMBER_ID_REQUIRED: {}", c1.member_id);
    w.advance(Duration::from_secs(1));
    let t2 = w.join(&mut c2);
    w.advance(Duration::from_secs(1));
    let t3 = w.join(&mut c3);
    assert_eq!(w.state(), "PreparingRebalance");
    // The delay restarts once for the members that came during it: 3 s, then 3 s more.
    w.advance(Duration::from_millis(3999));
    assert!(!w.answered(t1) && !w.answered(t2) && !w.answered(t3), "still waiting for members");
    w.advance(Duration::from_millis(1));

    let r1 = w.join_answer(t1, &mut c1).unwrap();
    let r2 = w.join_answer(t2, &mut c2).unwrap();
    let r3 = w.join_answer(t3, &mut c3).unwrap();
    for r in [&r1, &r2, &r3] {
        assert_eq!((r.error_code, r.generation_id), (0, 1));
        assert_eq!(r.leader.as_str(), c1.member_id, "the first to join leads");
        assert_eq!(r.protocol_name.as_deref(), Some("range"));
        assert_eq!(r.protocol_type.as_deref(), Some("consumer"));
    }
    let listed: Vec<(&str, &[u8])> = r1.members.iter().map(|m| (m.member_id.as_str(), &m.metadata[..])).collect();
    assert_eq!(
        listed,
        [
            (c1.member_id.as_str(), &b"sub:t;c1"[..]),
            (c2.member_id.as_str(), &b"sub:t;c2"[..]),
            (c3.member_id.as_str(), &b"sub:t;c3"[..])
        ],
        "the leader gets every member's metadata, in join order"
    );
    assert!(r2.members.is_empty() && r3.members.is_empty(), "followers get none");
    assert_eq!(w.state(), "CompletingRebalance");

    // Followers wait for the leader's assignment.
    let s2 = w.send_sync(&c2, &[]);
    let s3 = w.send_sync(&c3, &[]);
    assert!(!w.answered(s2) && !w.answered(s3));
    let s1 = w.send_sync(&c1, &[(&c1.member_id, b"t-0"), (&c2.member_id, b"t-1"), (&c3.member_id, b"t-2")]);
    for (t, part) in [(s1, b"t-0"), (s2, b"t-1"), (s3, b"t-2")] {
        let r = w.sync_answer(t).unwrap();
        assert_eq!((r.error_code, &r.assignment[..]), (0, &part[..]));
        assert_eq!(r.protocol_name.as_deref(), Some("range"));
    }
    let d = w.describe(5);
    assert_eq!(d.group_state.as_str(), "Stable");
    assert_eq!(d.protocol_type.as_str(), "consumer");
    assert_eq!(d.protocol_data.as_str(), "range");
    let assigned: Vec<&[u8]> = d.members.iter().map(|m| &m.member_assignment[..]).collect();
    assert_eq!(assigned, [&b"t-0"[..], b"t-1", b"t-2"]);
    assert_eq!(d.members[0].client_host.as_str(), "/127.0.0.1");
    assert_eq!(&d.members[1].member_metadata[..], b"sub:t;c2", "metadata is shown while Stable");
    for c in [&c1, &c2, &c3] {
        assert_eq!(w.heartbeat(c), 0);
    }
}

#[test]
fn a_member_leaving_rebalances_the_rest_into_a_new_generation_under_the_same_leader() {
    let mut w = World::new();
    let mut cs = three();
    w.form(&mut cs);
    let [mut c1, mut c2, c3] = cs;
    let r = w.leave(4, &[(&c3.member_id, None)]);
    assert_eq!((r.error_code, r.members[0].error_code), (0, 0));
    assert_eq!(w.state(), "PreparingRebalance");
    assert_eq!(w.heartbeat(&c1), code(ResponseError::RebalanceInProgress), "the others are told to rejoin");
    assert_eq!(w.heartbeat(&c2), code(ResponseError::RebalanceInProgress));
    let t2 = w.join(&mut c2);
    let t1 = w.join(&mut c1);
    let (r1, r2) = (w.join_answer(t1, &mut c1).unwrap(), w.join_answer(t2, &mut c2).unwrap());
    assert_eq!((r1.generation_id, r2.generation_id), (2, 2));
    assert_eq!(r1.leader.as_str(), c1.member_id, "the leader rejoined and stays leader");
    assert_eq!(r1.members.len(), 2);
    assert_eq!(w.heartbeat(&c3), code(ResponseError::UnknownMemberId), "the member that left is gone");
}

#[test]
fn a_member_joining_a_stable_group_rebalances_it_and_the_leader_is_kept() {
    let mut w = World::new();
    let mut cs = [Consumer::new("c1"), Consumer::new("c2")];
    w.form(&mut cs);
    let [mut c1, mut c2] = cs;
    let mut c3 = Consumer::new("c3");
    let t3 = w.join(&mut c3);
    assert!(!w.answered(t3), "parked until the members rejoin");
    assert_eq!(w.heartbeat(&c1), code(ResponseError::RebalanceInProgress));
    assert_eq!(w.heartbeat(&c2), code(ResponseError::RebalanceInProgress));
    // Offsets of the generation that is ending are still accepted while it rejoins.
    assert_eq!(w.commit(8, &c2.commit_request(&[("t", 1, 10)])), [0]);
    let t1 = w.join(&mut c1);
    assert!(!w.answered(t1));
    let t2 = w.join(&mut c2);
    let r3 = w.join_answer(t3, &mut c3).unwrap();
    let r1 = w.join_answer(t1, &mut c1).unwrap();
    w.join_answer(t2, &mut c2).unwrap();
    assert_eq!((r3.generation_id, r3.leader.as_str()), (2, c1.member_id.as_str()));
    assert_eq!(r1.members.len(), 3);
    let s3 = w.send_sync(&c3, &[]);
    w.send_sync(&c1, &[(&c3.member_id, b"p2")]);
    assert_eq!(&w.sync_answer(s3).unwrap().assignment[..], b"p2");
    let s2 = w.send_sync(&c2, &[]);
    let r2 = w.sync_answer(s2).unwrap();
    assert_eq!((r2.error_code, r2.assignment.len()), (0, 0), "a member the leader left out gets an empty assignment");
}

#[test]
fn a_member_that_misses_its_session_timeout_is_removed_and_the_group_rebalances() {
    let mut w = World::new();
    let mut cs = three();
    w.form(&mut cs);
    let [mut c1, mut c2, c3] = cs;
    // c1 and c2 heartbeat every 3 s; c3 goes quiet.
    for _ in 0..3 {
        w.advance(Duration::from_secs(3));
        assert_eq!(w.heartbeat(&c1), 0);
        assert_eq!(w.heartbeat(&c2), 0);
    }
    assert_eq!(w.state(), "Stable", "9 s: within c3's 10 s session");
    w.advance(Duration::from_secs(1));
    assert_eq!(w.state(), "PreparingRebalance", "c3's session expired");
    assert_eq!(w.describe(5).members.len(), 2);
    assert_eq!(w.heartbeat(&c1), code(ResponseError::RebalanceInProgress));
    let t1 = w.join(&mut c1);
    let t2 = w.join(&mut c2);
    let r1 = w.join_answer(t1, &mut c1).unwrap();
    w.join_answer(t2, &mut c2).unwrap();
    assert_eq!((r1.generation_id, r1.members.len()), (2, 2));
    assert_eq!(w.heartbeat(&c3), code(ResponseError::UnknownMemberId));
}

#[test]
fn a_member_that_does_not_rejoin_within_the_rebalance_timeout_is_left_out() {
    let mut w = World::new();
    let mut cs = three();
    w.form(&mut cs);
    let [mut c1, mut c2, c3] = cs;
    // The leader's JoinGroup rebalances a Stable group.
    let t1 = w.join(&mut c1);
    assert_eq!(w.state(), "PreparingRebalance");
    let t2 = w.join(&mut c2);
    // c3 keeps heartbeating but never rejoins: the join phase waits the rebalance timeout.
    for _ in 0..9 {
        w.advance(Duration::from_secs(3));
        assert_eq!(w.heartbeat(&c3), code(ResponseError::RebalanceInProgress));
    }
    assert!(!w.answered(t1), "27 s: still within the 30 s rebalance timeout");
    w.advance(Duration::from_secs(3));
    let r1 = w.join_answer(t1, &mut c1).unwrap();
    w.join_answer(t2, &mut c2).unwrap();
    assert_eq!((r1.generation_id, r1.members.len()), (2, 2));
    assert_eq!(w.heartbeat(&c3), code(ResponseError::UnknownMemberId));
}

#[test]
fn a_late_sync_group_still_gets_its_assignment() {
    let mut w = World::new();
    let mut cs = [Consumer::new("c1"), Consumer::new("c2")];
    w.join_all(&mut cs);
    let [c1, c2] = cs;
    let s1 = w.send_sync(&c1, &[(&c1.member_id, b"a"), (&c2.member_id, b"b")]);
    assert_eq!(&w.sync_answer(s1).unwrap().assignment[..], b"a");
    assert_eq!(w.state(), "Stable");
    w.advance(Duration::from_secs(5));
    let s2 = w.send_sync(&c2, &[]);
    let r2 = w.sync_answer(s2).expect("answered at once in a Stable group");
    assert_eq!((r2.error_code, &r2.assignment[..]), (0, &b"b"[..]));
}

#[test]
fn a_member_that_never_sends_sync_group_is_removed_after_the_rebalance_timeout() {
    let mut w = World::new();
    let mut cs = [Consumer::new("c1"), Consumer::new("c2")];
    w.join_all(&mut cs);
    let [c1, c2] = cs;
    let s1 = w.send_sync(&c1, &[(&c1.member_id, b"a")]);
    w.sync_answer(s1).unwrap();
    // c2 heartbeats (so its session holds) but never syncs.
    for _ in 0..9 {
        w.advance(Duration::from_secs(3));
        assert_eq!(w.heartbeat(&c2), 0);
        assert_eq!(w.heartbeat(&c1), 0);
    }
    w.advance(Duration::from_secs(3));
    assert_eq!(w.state(), "PreparingRebalance", "the wait for SyncGroups ended");
    assert_eq!(w.heartbeat(&c2), code(ResponseError::UnknownMemberId));
    assert_eq!(w.heartbeat(&c1), code(ResponseError::RebalanceInProgress));
}

#[test]
fn a_follower_waiting_for_its_assignment_is_told_to_rejoin_when_a_rebalance_starts() {
    let mut w = World::new();
    let mut cs = [Consumer::new("c1"), Consumer::new("c2")];
    w.join_all(&mut cs);
    let [_c1, c2] = cs;
    let s2 = w.send_sync(&c2, &[]);
    let mut c3 = Consumer::new("c3");
    w.join(&mut c3);
    let r = w.sync_answer(s2).unwrap();
    assert_eq!(r.error_code, code(ResponseError::RebalanceInProgress));
    assert_eq!(r.protocol_name, None);
}

#[test]
fn join_group_v4_and_later_require_a_member_id_first() {
    let mut w = World::new();
    for v in [4, 5, 7] {
        let mut c = Consumer::new(&format!("v{v}")).version(v);
        let t = w.send_join(&c);
        let r = w.join_answer(t, &mut c).unwrap();
        assert_eq!(r.error_code, code(ResponseError::MemberIdRequired), "v{v}");
        assert!(r.member_id.starts_with(&format!("v{v}-")), "{}", r.member_id);
        assert_eq!(r.member_id.len(), format!("v{v}-").len() + 36, "client id and a UUID");
    }
    // Before v4 a member joins at once.
    let mut old = Consumer::new("old").version(3);
    let t = w.send_join(&old);
    let r = w.join_answer(t, &mut old).unwrap();
    assert_eq!((r.error_code, r.generation_id), (0, 1));
    assert_eq!(w.c.member_count(), 4, "one member and three pending");
}

#[test]
fn a_pending_member_holds_a_rebalance_up_until_its_session_ends() {
    let mut w = World::new();
    let mut cs = [Consumer::new("c1")];
    w.form(&mut cs);
    let [mut c1] = cs;
    let mut late = Consumer::new("late");
    let t = w.send_join(&late);
    w.join_answer(t, &mut late).unwrap();
    // The leader rejoins; the pending member is expected too.
    let t1 = w.join(&mut c1);
    w.advance(SESSION - Duration::from_millis(1));
    assert!(!w.answered(t1));
    w.advance(Duration::from_millis(1));
    let r = w.join_answer(t1, &mut c1).expect("the pending member expired and the phase ended");
    assert_eq!((r.generation_id, r.members.len()), (2, 1));
    let t = w.send_join(&late);
    let r = w.join_answer(t, &mut late).unwrap();
    assert_eq!(r.error_code, code(ResponseError::UnknownMemberId), "its id is gone");
}

#[test]
fn a_pending_member_that_rejoins_with_its_id_becomes_a_member() {
    let mut w = World::new();
    let mut c = Consumer::new("c");
    let t = w.send_join(&c);
    w.join_answer(t, &mut c).unwrap();
    let id = c.member_id.clone();
    let t = w.send_join(&c);
    let r = w.join_answer(t, &mut c).unwrap();
    assert_eq!((r.error_code, r.member_id.as_str(), r.leader.as_str()), (0, id.as_str(), id.as_str()));
}

#[test]
fn a_closed_connection_forgets_its_join_group_but_the_member_stays_until_its_session_ends() {
    let mut w = World::new();
    let mut cs = [Consumer::new("c1"), Consumer::new("c2")];
    w.form(&mut cs);
    let [mut c1, mut c2] = cs;
    let t1 = w.join(&mut c1);
    w.c.cancel(t1);
    let t2 = w.join(&mut c2);
    let r2 = w.join_answer(t2, &mut c2).unwrap();
    assert_eq!(r2.members.len(), 0);
    assert_eq!(w.describe(5).members.len(), 2, "c1 is still a member of generation 2");
    assert!(w.in_flight(t1) && !w.answered(t1), "never answered once cancelled");
    // c1 never comes back: its session (restarted when generation 2 formed) ends.
    let s2 = w.send_sync(&c2, &[]);
    w.advance(SESSION);
    assert_eq!(w.sync_answer(s2).unwrap().error_code, code(ResponseError::RebalanceInProgress));
    assert_eq!(w.describe(5).members.len(), 1);
}

#[test]
fn the_protocol_is_the_one_every_member_supports_with_the_most_votes() {
    let mut w = World::new();
    let mut cs = [
        Consumer::new("a").protocols(&["cooperative-sticky", "range"]),
        Consumer::new("b").protocols(&["range", "cooperative-sticky"]),
        Consumer::new("c").protocols(&["roundrobin", "range", "cooperative-sticky"]),
    ];
    // Candidates: range and cooperative-sticky. Votes: a sticky, b range, c range.
    let r = w.join_all(&mut cs).remove(0);
    assert_eq!(r.protocol_name.as_deref(), Some("range"));
    assert_eq!(&r.members[0].metadata[..], b"range:a", "the leader sees each member's metadata for it");
    let mut d = Consumer::new("d").protocols(&["roundrobin"]);
    let t = w.send_join(&d);
    let r = w.join_answer(t, &mut d).unwrap();
    assert_eq!(r.error_code, code(ResponseError::InconsistentGroupProtocol), "no protocol in common");
}

#[test]
fn a_group_whose_members_all_leave_is_empty_and_keeps_its_generation() {
    let mut w = World::new();
    let mut cs = [Consumer::new("c1"), Consumer::new("c2")];
    w.form(&mut cs);
    let ids: Vec<(&str, Option<&str>)> = cs.iter().map(|c| (c.member_id.as_str(), None)).collect();
    assert_eq!(w.leave(3, &ids).members.iter().map(|m| m.error_code).collect::<Vec<_>>(), [0, 0]);
    let d = w.describe(5);
    assert_eq!((d.group_state.as_str(), d.members.len()), ("Empty", 0));
    assert_eq!(w.c.group(GROUP).unwrap().generation, 2, "the empty generation counts too");
    let mut c = Consumer::new("again");
    let t = w.join(&mut c);
    assert_eq!(w.join_answer(t, &mut c).unwrap().generation_id, 3);
}

#[test]
fn join_group_answers_have_the_shape_of_every_version() {
    for v in 0..=7 {
        let mut w = World::new();
        let mut c = Consumer::new("c").version(v);
        let t = w.join(&mut c);
        let r = w.join_answer(t, &mut c).unwrap();
        assert_eq!((r.error_code, r.generation_id), (0, 1), "v{v}");
        assert_eq!(r.protocol_name.as_deref(), Some("range"), "v{v}");
        let expected_type = if v >= 7 { Some("consumer") } else { None };
        assert_eq!(r.protocol_type.as_deref(), expected_type, "v{v}");
        // An error answer carries no protocol: "" before v7, null from v7.
        let mut bad = Consumer::new("x").version(v);
        bad.session = Duration::from_secs(1);
        let t = w.send_join(&bad);
        let r = w.join_answer(t, &mut bad).unwrap();
        assert_eq!(r.error_code, code(ResponseError::InvalidSessionTimeout), "v{v}");
        assert_eq!(r.protocol_name.as_deref(), if v >= 7 { None } else { Some("") }, "v{v}");
    }
}

#[test]
fn join_group_v0_uses_the_session_timeout_as_its_rebalance_timeout() {
    let mut w = World::new();
    let mut cs = [Consumer::new("c1").version(0), Consumer::new("c2").version(0)];
    w.form(&mut cs);
    let [mut c1, _c2] = cs;
    let t1 = w.join(&mut c1);
    // c2 does not rejoin: with v0 the phase ends after the 10 s session timeout, not 30 s.
    w.advance(SESSION);
    assert!(w.join_answer(t1, &mut c1).is_some());
}
