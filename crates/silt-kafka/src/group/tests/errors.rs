//! Every error code of the group APIs, where Kafka returns it.

use super::*;

fn join_code(w: &mut World, c: &mut Consumer) -> i16 {
    let t = w.send_join(c);
    w.join_answer(t, c).expect("answered at once").error_code
}

fn sync_code(w: &mut World, c: &Consumer) -> i16 {
    let t = w.send_sync(c, &[]);
    w.sync_answer(t).expect("answered at once").error_code
}

/// A Stable group of two dynamic members and one static ("i3").
fn stable() -> (World, Vec<Consumer>) {
    let mut w = World::new();
    let mut cs = vec![Consumer::new("c1"), Consumer::new("c2"), Consumer::new("c3").instance("i3")];
    w.form(&mut cs);
    (w, cs)
}

#[test]
fn join_group_refusals() {
    let (mut w, cs) = stable();
    let mut c = Consumer::new("x");
    c.session = Duration::from_millis(5999);
    assert_eq!(join_code(&mut w, &mut c), code(ResponseError::InvalidSessionTimeout), "below the minimum");
    c.session = Duration::from_millis(1_800_001);
    assert_eq!(join_code(&mut w, &mut c), code(ResponseError::InvalidSessionTimeout), "above the maximum");

    let t = w.token(ApiKey::JoinGroup, 7);
    let r = Consumer::new("x").join_request().with_group_id(GroupId(s("")));
    w.c.handle_join_group(w.now, t, 7, World::client("x"), &r);
    w.run();
    let Some(ResponseKind::JoinGroup(r)) = w.take(t) else { panic!() };
    assert_eq!(r.error_code, code(ResponseError::InvalidGroupId));

    // Another protocol type than the group's.
    let t = w.token(ApiKey::JoinGroup, 7);
    let r = Consumer::new("x").join_request().with_protocol_type(s("connect"));
    w.c.handle_join_group(w.now, t, 7, World::client("x"), &r);
    w.run();
    let Some(ResponseKind::JoinGroup(r)) = w.take(t) else { panic!() };
    assert_eq!(r.error_code, code(ResponseError::InconsistentGroupProtocol));

    let mut stranger = Consumer::new("s");
    stranger.member_id = "s-not-a-member".into();
    assert_eq!(join_code(&mut w, &mut stranger), code(ResponseError::UnknownMemberId));

    let mut impostor = cs[2].clone();
    impostor.member_id = cs[0].member_id.clone();
    assert_eq!(join_code(&mut w, &mut impostor), code(ResponseError::FencedInstanceId), "i3 is another member");
    let mut unknown_instance = cs[0].clone().instance("nobody");
    assert_eq!(join_code(&mut w, &mut unknown_instance), code(ResponseError::UnknownMemberId));
}

#[test]
fn a_new_group_needs_a_protocol_type_and_a_protocol() {
    let mut w = World::new();
    let t = w.token(ApiKey::JoinGroup, 7);
    w.c.handle_join_group(
        w.now,
        t,
        7,
        World::client("x"),
        &Consumer::new("x").join_request().with_protocol_type(s("")),
    );
    w.run();
    let Some(ResponseKind::JoinGroup(r)) = w.take(t) else { panic!() };
    assert_eq!(r.error_code, code(ResponseError::InconsistentGroupProtocol));
    let mut none = Consumer::new("y");
    none.protocols.clear();
    assert_eq!(join_code(&mut w, &mut none), code(ResponseError::InconsistentGroupProtocol));
    assert!(w.c.group(GROUP).is_none(), "a request that created the group and failed leaves none behind");
    let mut big = commit_request(-1, "", None, &[("t", 0, 1)]);
    big.topics[0].partitions[0].committed_metadata = Some(s(&"m".repeat(4097)));
    assert_eq!(w.commit(8, &big), [code(ResponseError::OffsetMetadataTooLarge)]);
    assert!(w.c.group(GROUP).is_none());
}

#[test]
fn a_member_id_for_a_group_that_does_not_exist_is_unknown() {
    let mut w = World::new();
    let mut c = Consumer::new("c");
    c.member_id = "c-from-before-a-restart".into();
    assert_eq!(join_code(&mut w, &mut c), code(ResponseError::UnknownMemberId));
    assert!(w.c.group(GROUP).is_none(), "only a new member creates a group");
    assert_eq!(sync_code(&mut w, &c), code(ResponseError::UnknownMemberId));
    assert_eq!(w.heartbeat(&c), code(ResponseError::UnknownMemberId));
}

#[test]
fn a_full_group_refuses_new_members() {
    let mut w = World::with(Settings { max_group_size: 2, ..settings() });
    let mut cs = [Consumer::new("c1"), Consumer::new("c2")];
    w.form(&mut cs);
    let mut third = Consumer::new("c3");
    assert_eq!(join_code(&mut w, &mut third), code(ResponseError::GroupMaxSizeReached));
    assert_eq!(w.state(), "Stable", "the members are undisturbed");
    // A member already in may rejoin.
    let t = w.join(&mut cs[0]);
    assert!(!w.answered(t));
}

#[test]
fn sync_group_refusals() {
    let (mut w, mut cs) = stable();
    let mut stale = cs[0].clone();
    stale.generation -= 1;
    assert_eq!(sync_code(&mut w, &stale), code(ResponseError::IllegalGeneration));
    let mut stranger = cs[0].clone();
    stranger.member_id = "nobody".into();
    assert_eq!(sync_code(&mut w, &stranger), code(ResponseError::UnknownMemberId));
    let mut impostor = cs[2].clone();
    impostor.member_id = cs[1].member_id.clone();
    assert_eq!(sync_code(&mut w, &impostor), code(ResponseError::FencedInstanceId));

    // v5 must name the protocol type and name, and they must be the group's.
    let t = w.token(ApiKey::SyncGroup, 5);
    w.c.handle_sync_group(w.now, t, 5, &cs[0].sync_request(&[]).with_protocol_name(None));
    w.run();
    assert_eq!(w.sync_answer(t).unwrap().error_code, code(ResponseError::InconsistentGroupProtocol));
    let t = w.token(ApiKey::SyncGroup, 5);
    w.c.handle_sync_group(w.now, t, 5, &cs[0].sync_request(&[]).with_protocol_name(Some(s("roundrobin"))));
    w.run();
    assert_eq!(w.sync_answer(t).unwrap().error_code, code(ResponseError::InconsistentGroupProtocol));
    // Before v5 they are not sent, and not checked.
    let t = w.token(ApiKey::SyncGroup, 4);
    w.c.handle_sync_group(w.now, t, 4, &wire(&cs[0].sync_request(&[]), 4));
    w.run();
    assert_eq!(w.sync_answer(t).unwrap().error_code, 0);

    let t = w.token(ApiKey::SyncGroup, 5);
    w.c.handle_sync_group(w.now, t, 5, &cs[0].sync_request(&[]).with_group_id(GroupId(s(""))));
    w.run();
    assert_eq!(w.sync_answer(t).unwrap().error_code, code(ResponseError::InvalidGroupId));

    // During the join phase.
    let t = w.join(&mut cs[0]);
    assert_eq!(sync_code(&mut w, &cs[1]), code(ResponseError::RebalanceInProgress));
    assert!(!w.answered(t));
}

#[test]
fn heartbeat_refusals() {
    let (mut w, mut cs) = stable();
    let mut stale = cs[0].clone();
    stale.generation += 1;
    assert_eq!(w.heartbeat(&stale), code(ResponseError::IllegalGeneration));
    let mut stranger = cs[0].clone();
    stranger.member_id = "nobody".into();
    assert_eq!(w.heartbeat(&stranger), code(ResponseError::UnknownMemberId));
    let mut impostor = cs[2].clone();
    impostor.member_id = cs[1].member_id.clone();
    assert_eq!(w.heartbeat(&impostor), code(ResponseError::FencedInstanceId));
    let r = w.c.handle_heartbeat(w.now, 4, &cs[0].heartbeat_request().with_group_id(GroupId(s(""))));
    assert_eq!(r.error_code, code(ResponseError::InvalidGroupId));
    w.join(&mut cs[0]);
    assert_eq!(w.heartbeat(&cs[1]), code(ResponseError::RebalanceInProgress));
}

#[test]
fn leave_group_before_v3_answers_its_one_member_at_the_top() {
    let (mut w, cs) = stable();
    let r = w.leave(0, &[("nobody", None)]);
    assert_eq!(r.error_code, code(ResponseError::UnknownMemberId));
    assert!(r.members.is_empty());
    let r = w.leave(2, &[(&cs[1].member_id, None)]);
    assert_eq!(r.error_code, 0);
    assert_eq!(w.describe(5).members.len(), 2);
    // A group that does not exist: each member is unknown.
    let mut gone = World::new();
    let r = gone.leave(3, &[("a", None), ("b", None)]);
    assert_eq!(r.members.iter().map(|m| m.error_code).collect::<Vec<_>>(), [25, 25]);
    let r = gone.leave(1, &[("a", None)]);
    assert_eq!(r.error_code, code(ResponseError::UnknownMemberId));
    let r = w.c.handle_leave_group(w.now, 4, &leave_request(4, &[("a", None)]).with_group_id(GroupId(s(""))));
    assert_eq!(r.error_code, code(ResponseError::InvalidGroupId));
}

#[test]
fn offset_commit_refusals() {
    let (mut w, mut cs) = stable();
    let ok = cs[0].commit_request(&[("t", 0, 5)]);
    assert_eq!(w.commit(8, &ok), [0]);
    let mut stale = cs[0].clone();
    stale.generation -= 1;
    assert_eq!(w.commit(8, &stale.commit_request(&[("t", 0, 6)])), [code(ResponseError::IllegalGeneration)]);
    let mut stranger = cs[0].clone();
    stranger.member_id = "nobody".into();
    assert_eq!(w.commit(8, &stranger.commit_request(&[("t", 0, 6)])), [code(ResponseError::UnknownMemberId)]);
    let mut impostor = cs[2].clone();
    impostor.member_id = cs[1].member_id.clone();
    assert_eq!(w.commit(8, &impostor.commit_request(&[("t", 0, 6)])), [code(ResponseError::FencedInstanceId)]);
    // Generation -1 without a member id: only an empty group takes it.
    let simple = commit_request(-1, "", None, &[("t", 0, 6)]);
    assert_eq!(w.commit(8, &simple), [code(ResponseError::UnknownMemberId)]);
    // The driver's check, per partition; the rest still commits.
    let mixed = cs[0].commit_request(&[("unknown", 0, 1), ("t", 1, 7), ("t", -1, 1)]);
    let unknown = code(ResponseError::UnknownTopicOrPartition);
    assert_eq!(w.commit(8, &mixed), [unknown, 0, unknown]);
    // Metadata over offset.metadata.max.bytes.
    let mut big = cs[0].commit_request(&[("t", 2, 1)]);
    big.topics[0].partitions[0].committed_metadata = Some(s(&"m".repeat(4097)));
    assert_eq!(w.commit(8, &big), [code(ResponseError::OffsetMetadataTooLarge)]);
    assert_eq!(w.committed("t", 2), -1);
    assert_eq!(w.committed("t", 0), 5, "refused commits change nothing");
    assert_eq!(w.committed("t", 1), 7);

    // While the leader's assignment is awaited.
    for c in cs.iter_mut() {
        w.join(c);
    }
    assert_eq!(w.state(), "CompletingRebalance");
    for c in cs.iter_mut() {
        c.generation += 1;
    }
    assert_eq!(w.commit(8, &cs[1].commit_request(&[("t", 0, 9)])), [code(ResponseError::RebalanceInProgress)]);
}

#[test]
fn a_commit_with_a_generation_to_a_group_that_does_not_exist_is_an_illegal_generation() {
    let mut w = World::new();
    assert_eq!(w.commit(8, &commit_request(3, "m", None, &[("t", 0, 1)])), [code(ResponseError::IllegalGeneration)]);
    assert!(w.c.group(GROUP).is_none());
}

#[test]
fn delete_groups_refusals() {
    let (mut w, _cs) = stable();
    let t = w.send_delete(2, &[GROUP, "nope", GROUP]);
    let Some(ResponseKind::DeleteGroups(r)) = w.take(t) else { panic!() };
    let results: Vec<(&str, i16)> = r.results.iter().map(|r| (r.group_id.0.as_str(), r.error_code)).collect();
    assert_eq!(
        results,
        [(GROUP, code(ResponseError::NonEmptyGroup)), ("nope", code(ResponseError::GroupIdNotFound))],
        "repeated names are dropped"
    );
    assert_eq!(w.state(), "Stable");
}

#[test]
fn a_group_that_does_not_exist_is_described_as_dead() {
    let mut w = World::new();
    for v in 0..=5 {
        let d = w.describe(v);
        assert_eq!((d.error_code, d.group_state.as_str(), d.members.len()), (0, "Dead", 0), "v{v}");
    }
}

#[test]
fn the_versions_served_are_ones_the_codec_knows() {
    for &(key, min, max) in SERVED {
        let known = key.valid_versions();
        assert!(min <= max && min >= known.min && max <= known.max, "{key:?} {min}..={max} vs {known:?}");
    }
}
