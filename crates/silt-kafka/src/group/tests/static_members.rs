//! Static membership (`group.instance.id`, JoinGroup v5+): a restarted member takes its
//! instance's place back.

use super::*;

fn statics(n: usize) -> Vec<Consumer> {
    (1..=n).map(|i| Consumer::new(&format!("c{i}")).instance(&format!("i{i}"))).collect()
}

/// The same consumer after a restart: its instance id, no member id.
fn restarted(c: &Consumer) -> Consumer {
    let mut again = c.clone();
    again.member_id.clear();
    again.generation = -1;
    again
}

#[test]
fn a_static_member_rejoining_with_unchanged_metadata_replaces_itself_without_a_rebalance() {
    let mut w = World::new();
    let mut cs = statics(3);
    w.form(&mut cs);
    let old = cs[1].clone();
    let mut again = restarted(&old);
    let t = w.send_join(&again);
    let r = w.join_answer(t, &mut again).expect("answered at once");
    assert_eq!(r.error_code, 0);
    assert!(again.member_id.starts_with("i2-") && again.member_id != old.member_id, "{}", again.member_id);
    assert_eq!((r.generation_id, r.leader.as_str()), (1, cs[0].member_id.as_str()), "the same generation");
    assert!(r.members.is_empty());
    assert_eq!(w.state(), "Stable");
    assert_eq!(w.heartbeat(&cs[0]), 0, "no rebalance");
    assert_eq!(w.heartbeat(&old), code(ResponseError::FencedInstanceId), "the old member id is fenced");
    let t = w.send_sync(&again, &[]);
    assert_eq!(&w.sync_answer(t).unwrap().assignment[..], b"p1", "it gets its old assignment back");
    let d = w.describe(5);
    let ids: Vec<&str> = d.members.iter().map(|m| m.member_id.as_str()).collect();
    assert_eq!(ids, [cs[0].member_id.as_str(), again.member_id.as_str(), cs[2].member_id.as_str()]);
    assert_eq!(d.members[1].group_instance_id.as_deref(), Some("i2"));
}

#[test]
fn a_static_leader_coming_back_is_named_as_the_old_leader_and_keeps_the_assignment() {
    let mut w = World::new();
    let mut cs = statics(2);
    w.form(&mut cs);
    let old_leader = cs[0].member_id.clone();
    let mut again = restarted(&cs[0]);
    let t = w.send_join(&again);
    let r = w.join_answer(t, &mut again).unwrap();
    // Before JoinGroup v9 the leader field keeps the old id: the member acts as a follower
    // and does not assign again.
    assert_eq!(r.leader.as_str(), old_leader);
    assert_ne!(r.member_id.as_str(), old_leader);
    assert!(w.is_leader(&again), "it is the leader all the same");
    let t = w.send_sync(&again, &[]);
    assert_eq!(&w.sync_answer(t).unwrap().assignment[..], b"p0");
    assert_eq!(w.heartbeat(&cs[1]), 0);
}

#[test]
fn a_static_member_that_changes_the_selected_protocol_rebalances_the_group() {
    let mut w = World::new();
    let mut cs = vec![
        Consumer::new("c1").instance("i1").protocols(&["roundrobin", "range"]),
        Consumer::new("c2").instance("i2").protocols(&["range", "roundrobin"]),
    ];
    let r = w.join_all(&mut cs);
    assert_eq!(r[0].protocol_name.as_deref(), Some("roundrobin"), "a tie goes to the first member's choice");
    let mut again = restarted(&cs[0]).protocols(&["range", "roundrobin"]);
    let t = w.send_join(&again);
    assert!(!w.answered(t), "range now wins: the group rebalances");
    assert_eq!(w.state(), "PreparingRebalance");
    let t2 = w.join(&mut cs[1]);
    let r = w.join_answer(t, &mut again).unwrap();
    assert_eq!((r.generation_id, r.protocol_name.as_deref()), (2, Some("range")));
    assert!(w.join_answer(t2, &mut cs[1]).is_some());
}

#[test]
fn a_static_member_restarting_while_its_old_join_waits_fences_the_old_one() {
    let mut w = World::new();
    let mut cs = statics(2);
    w.form(&mut cs);
    let t_old = w.join(&mut cs[0]);
    assert_eq!(w.state(), "PreparingRebalance", "the leader's JoinGroup rebalances");
    let mut again = restarted(&cs[0]);
    let t_new = w.send_join(&again);
    let r = w.join_answer(t_old, &mut cs[0]).expect("the old JoinGroup is answered");
    assert_eq!(r.error_code, code(ResponseError::FencedInstanceId));
    assert!(!w.answered(t_new));
    let t2 = w.join(&mut cs[1]);
    let r = w.join_answer(t_new, &mut again).unwrap();
    assert_eq!((r.error_code, r.generation_id, r.leader.as_str()), (0, 2, again.member_id.as_str()));
    assert!(w.join_answer(t2, &mut cs[1]).is_some());
}

#[test]
fn a_static_member_keeps_its_place_through_a_rebalance_it_misses() {
    let mut w = World::new();
    let mut cs = statics(3);
    for c in &mut cs {
        c.session = Duration::from_secs(120);
    }
    w.form(&mut cs);
    let t1 = w.join(&mut cs[0]);
    let t2 = w.join(&mut cs[1]);
    // c3 is restarting and misses the join phase.
    w.advance(REBALANCE);
    let r = w.join_answer(t1, &mut cs[0]).unwrap();
    assert!(w.join_answer(t2, &mut cs[1]).is_some());
    let listed: Vec<&str> = r.members.iter().map(|m| m.member_id.as_str()).collect();
    assert_eq!(listed.len(), 3, "a static member is not dropped for missing a rebalance: {listed:?}");
    assert!(listed.contains(&cs[2].member_id.as_str()));
    assert_eq!(r.members[2].group_instance_id.as_deref(), Some("i3"));
}

#[test]
fn leave_group_names_static_members_by_instance_id_alone() {
    let mut w = World::new();
    let mut cs = statics(3);
    w.form(&mut cs);
    let r = w.leave(4, &[("", Some("i3")), ("", Some("nobody")), ("wrong-id", Some("i2"))]);
    let codes: Vec<i16> = r.members.iter().map(|m| m.error_code).collect();
    assert_eq!(
        codes,
        [0, code(ResponseError::UnknownMemberId), code(ResponseError::FencedInstanceId)],
        "removed, unknown instance, another member id for the instance"
    );
    assert_eq!(r.members[0].group_instance_id.as_deref(), Some("i3"));
    assert_eq!(w.describe(5).members.len(), 2);
    assert_eq!(w.state(), "PreparingRebalance");
}

#[test]
fn static_members_are_described_at_every_version() {
    let mut w = World::new();
    let mut cs = statics(2);
    w.form(&mut cs);
    for v in 0..=5 {
        let d = w.describe(v);
        assert_eq!(d.members.len(), 2, "v{v}");
        let instance = if v >= 4 { Some("i1") } else { None };
        assert_eq!(d.members[0].group_instance_id.as_deref(), instance, "v{v}");
    }
}
