//! Committed offsets: durability before the answer, fetch, restore after a restart,
//! deletion, retention.

use super::*;

fn simple(offsets: &[(&str, i32, i64)]) -> OffsetCommitRequest {
    commit_request(-1, "", None, offsets)
}

#[test]
fn offsets_committed_by_a_stale_generation_are_refused() {
    let mut w = World::new();
    let mut cs = [Consumer::new("c1"), Consumer::new("c2")];
    w.form(&mut cs);
    let before = cs[1].clone();
    // c2 rejoins into generation 2 (the leader rebalances); a commit of generation 1 is late.
    let t1 = w.join(&mut cs[0]);
    let t2 = w.join(&mut cs[1]);
    w.join_answer(t1, &mut cs[0]).unwrap();
    w.join_answer(t2, &mut cs[1]).unwrap();
    let s1 = w.send_sync(&cs[0], &[(&cs[1].member_id, b"p")]);
    w.sync_answer(s1).unwrap();
    assert_eq!(w.commit(8, &before.commit_request(&[("t", 0, 10)])), [code(ResponseError::IllegalGeneration)]);
    assert_eq!(w.committed("t", 0), -1);
    assert_eq!(w.commit(8, &cs[1].commit_request(&[("t", 0, 11)])), [0]);
    assert_eq!(w.committed("t", 0), 11);
}

#[test]
fn a_commit_is_answered_only_once_it_is_durable() {
    let mut w = World::new();
    w.hold_persists = true;
    let t = w.send_commit(8, &simple(&[("t", 0, 42), ("t", 1, 43)]));
    assert!(!w.answered(t), "not before the records are durable");
    assert_eq!(w.committed("t", 0), -1, "a fetch does not see what a crash could take back");
    let (_, records) = w.persists.front().unwrap();
    assert_eq!(records.len(), 2);
    let Record::Commit { group, topic, partition, offset } = &records[0] else { panic!("{records:?}") };
    assert_eq!((group.as_str(), topic.as_str(), *partition, offset.offset), (GROUP, "t", 0, 42));
    assert_eq!(offset.commit_timestamp, Timestamp(EPOCH_MS));
    assert_eq!(offset.metadata, "meta");
    w.persist_all();
    assert_eq!(w.commit_codes(t), Some(vec![0, 0]));
    assert_eq!((w.committed("t", 0), w.committed("t", 1)), (42, 43));
}

#[test]
fn persist_batches_become_durable_in_order() {
    let mut w = World::new();
    w.hold_persists = true;
    let t1 = w.send_commit(8, &simple(&[("t", 0, 1)]));
    let t2 = w.send_commit(8, &simple(&[("t", 0, 2)]));
    let t3 = w.send_commit(8, &simple(&[("t", 0, 3)]));
    let ids: Vec<PersistId> = w.persists.iter().map(|(id, _)| *id).collect();
    assert!(ids.windows(2).all(|p| p[0] < p[1]));
    // The second is durable, so is the first.
    w.c.handle_persisted(ids[1]);
    w.run();
    assert!(w.answered(t1) && w.answered(t2) && !w.answered(t3));
    assert_eq!(w.committed("t", 0), 2);
}

#[test]
fn a_failed_persist_is_answered_coordinator_not_available_and_not_applied() {
    let mut w = World::new();
    w.hold_persists = true;
    let t = w.send_commit(8, &simple(&[("t", 0, 7), ("unknown", 0, 1)]));
    let (id, _) = w.persists.pop_front().unwrap();
    w.c.handle_persist_failed(id);
    w.run();
    let unknown = code(ResponseError::UnknownTopicOrPartition);
    assert_eq!(w.commit_codes(t), Some(vec![code(ResponseError::CoordinatorNotAvailable), unknown]));
    assert_eq!(w.committed("t", 0), -1);
}

#[test]
fn a_closed_connection_loses_its_answer_but_not_its_commit() {
    let mut w = World::new();
    w.hold_persists = true;
    let t = w.send_commit(8, &simple(&[("t", 0, 5)]));
    w.c.cancel(t);
    w.persist_all();
    assert!(!w.answered(t));
    assert_eq!(w.committed("t", 0), 5);
}

#[test]
fn commits_survive_a_persist_and_restore_round_trip() {
    let mut w = World::new();
    let mut cs = [Consumer::new("c1")];
    w.form(&mut cs);
    let mut r = cs[0].commit_request(&[("orders", 0, 100), ("orders", 1, 200), ("audit", 0, 3)]);
    r.topics[0].partitions[0].committed_leader_epoch = 4;
    r.topics[0].partitions[1].committed_metadata = None;
    assert_eq!(w.commit(8, &r), [0, 0, 0]);
    assert_eq!(w.commit(8, &cs[0].commit_request(&[("orders", 1, 250)])), [0], "a later commit wins");
    // Another group, simple commits only.
    let other = simple(&[("orders", 0, 9)]).with_group_id(GroupId(s("other")));
    assert_eq!(w.commit(8, &other), [0]);

    let mut after = w.restarted();
    let f = after.fetch(7, Some(&[("orders", &[0, 1, 2]), ("audit", &[0])]));
    let got: Vec<(i64, i32, Option<&str>)> = f
        .topics
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| (p.committed_offset, p.committed_leader_epoch, p.metadata.as_deref()))
        .collect();
    assert_eq!(got, [(100, 4, Some("meta")), (250, -1, Some("meta")), (-1, -1, Some("")), (3, -1, Some("meta"))]);
    assert_eq!(after.state(), "Empty", "membership is not persisted: the group comes back empty");
    let mut c = cs[0].clone();
    assert_eq!(after.heartbeat(&c), code(ResponseError::UnknownMemberId));
    let t = after.join(&mut c);
    assert_eq!(
        after.join_answer(t, &mut c).unwrap().error_code,
        code(ResponseError::UnknownMemberId),
        "it rejoins anew"
    );
    assert_eq!(
        after.c.committed_offsets("other").map(|(t, p, c)| (t, p, c.offset)).collect::<Vec<_>>(),
        [("orders", 0, 9)]
    );

    // A snapshot of the offsets restores the same state as the whole log.
    let snapshot: Vec<Bytes> = w.c.snapshot().map(|r| r.encode().unwrap()).collect();
    assert_eq!(snapshot.len(), 4);
    let mut compacted = World::new();
    compacted.log = snapshot;
    let compacted = compacted.restarted();
    for g in [GROUP, "other"] {
        let a: Vec<_> = compacted.c.committed_offsets(g).collect();
        let b: Vec<_> = after.c.committed_offsets(g).collect();
        assert_eq!(a, b, "{g}");
    }
}

#[test]
fn a_deleted_group_stays_deleted_after_a_restart() {
    let mut w = World::new();
    assert_eq!(w.commit(8, &simple(&[("t", 0, 1)])), [0]);
    w.hold_persists = true;
    let t = w.send_delete(2, &[GROUP]);
    assert!(!w.answered(t), "answered once the tombstone is durable");
    assert_eq!(w.committed("t", 0), -1, "gone for requests at once");
    w.persist_all();
    let Some(ResponseKind::DeleteGroups(r)) = w.take(t) else { panic!() };
    assert_eq!(r.results[0].error_code, 0);
    assert_eq!(w.state(), "Dead");
    let mut after = w.restarted();
    assert_eq!(after.committed("t", 0), -1);
    assert!(after.c.group(GROUP).is_none());
}

#[test]
fn a_commit_in_flight_when_its_group_is_deleted_is_not_applied() {
    let mut w = World::new();
    w.hold_persists = true;
    let t = w.send_commit(8, &simple(&[("t", 0, 1)]));
    let d = w.send_delete(2, &[GROUP]);
    // A new incarnation of the group, committed after the deletion.
    let t2 = w.send_commit(8, &simple(&[("t", 1, 2)]));
    w.persist_all();
    assert_eq!(w.commit_codes(t), Some(vec![0]));
    assert!(w.answered(d));
    assert_eq!(w.commit_codes(t2), Some(vec![0]));
    // The log has the commit, then the tombstone, then the new commit: memory agrees.
    assert_eq!((w.committed("t", 0), w.committed("t", 1)), (-1, 2));
    let mut after = w.restarted();
    assert_eq!((after.committed("t", 0), after.committed("t", 1)), (-1, 2));
}

#[test]
fn a_group_deletion_that_cannot_be_persisted_brings_the_group_back() {
    let mut w = World::new();
    assert_eq!(w.commit(8, &simple(&[("t", 0, 1), ("t", 1, 1)])), [0, 0]);
    w.hold_persists = true;
    let t = w.send_commit(8, &simple(&[("t", 0, 2)]));
    let d = w.send_delete(2, &[GROUP]);
    // Recreated meanwhile, with an offset of its own.
    let t2 = w.send_commit(8, &simple(&[("t", 1, 3)]));
    // The commit of the old group is durable, then its deletion fails.
    w.persist_first();
    let (delete, _) = w.persists.pop_front().unwrap();
    w.c.handle_persist_failed(delete);
    w.persist_all();
    let Some(ResponseKind::DeleteGroups(r)) = w.take(d) else { panic!() };
    assert_eq!(r.results[0].error_code, code(ResponseError::CoordinatorNotAvailable));
    assert_eq!((w.commit_codes(t), w.commit_codes(t2)), (Some(vec![0]), Some(vec![0])));
    // The log holds both commits and no tombstone: so does memory.
    assert_eq!((w.committed("t", 0), w.committed("t", 1)), (2, 3));
    let mut after = w.restarted();
    assert_eq!((after.committed("t", 0), after.committed("t", 1)), (2, 3));
}

#[test]
fn an_empty_group_takes_simple_commits_and_fetch_reports_them_all() {
    let mut w = World::new();
    assert_eq!(w.commit(8, &simple(&[("b", 1, 11), ("a", 0, 10)])), [0, 0]);
    assert_eq!(w.state(), "Empty");
    let all = w.fetch(7, None);
    let got: Vec<(&str, i32, i64)> = all
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (t.name.0.as_str(), p.partition_index, p.committed_offset)))
        .collect();
    assert_eq!(got, [("a", 0, 10), ("b", 1, 11)]);
    assert_eq!(all.error_code, 0);
    // v1: partitions named, no leader epoch, no top-level error.
    let v1 = w.fetch(1, Some(&[("a", &[0, 5])]));
    let got: Vec<(i32, i64)> =
        v1.topics[0].partitions.iter().map(|p| (p.partition_index, p.committed_offset)).collect();
    assert_eq!(got, [(0, 10), (5, -1)]);
    // A group that does not exist has no offsets (no error, as in Kafka).
    let none = wire(&fetch_request(Some(&[("a", &[0])])).with_group_id(GroupId(s("nope"))), 7);
    let r = w.c.handle_offset_fetch(7, &none);
    assert_eq!((r.error_code, r.topics[0].partitions[0].committed_offset), (0, -1));
    // Once the group has members, generation -1 is refused.
    let mut cs = [Consumer::new("c")];
    w.form(&mut cs);
    assert_eq!(w.commit(8, &simple(&[("a", 0, 1)])), [code(ResponseError::UnknownMemberId)]);
}

#[test]
fn every_offset_commit_and_fetch_version_is_served() {
    for v in 2..=8 {
        let mut w = World::new();
        let mut cs = [Consumer::new("c")];
        w.form(&mut cs);
        assert_eq!(w.commit(v, &cs[0].commit_request(&[("t", 0, i64::from(v))])), [0], "v{v}");
        for f in 1..=7 {
            let r = w.fetch(f, Some(&[("t", &[0])]));
            assert_eq!(r.topics[0].partitions[0].committed_offset, i64::from(v), "commit v{v}, fetch v{f}");
        }
    }
}

#[test]
fn offsets_of_an_empty_group_expire_after_the_retention_and_then_the_group_goes() {
    let retention = Duration::from_secs(3600);
    let check = Duration::from_secs(60);
    let mut w =
        World::with(Settings { offsets_retention: retention, offsets_retention_check_interval: check, ..settings() });
    let mut cs = [Consumer::new("c")];
    w.form(&mut cs);
    assert_eq!(w.commit(8, &cs[0].commit_request(&[("t", 0, 5)])), [0]);
    // While the member is there nothing expires, however long.
    for _ in 0..10 {
        w.advance(Duration::from_secs(3));
        w.heartbeat(&cs[0]);
    }
    w.advance(Duration::ZERO);
    w.leave(3, &[(&cs[0].member_id, None)]);
    assert_eq!(w.state(), "Empty");
    w.advance(retention - check);
    assert_eq!(w.committed("t", 0), 5, "the retention counts from when the group became empty");
    w.advance(check * 2);
    assert_eq!(w.committed("t", 0), -1);
    assert_eq!(w.state(), "Dead", "an empty group without offsets goes");
    let tombstone = Record::decode(w.log.last().unwrap()).unwrap();
    assert_eq!(tombstone, Record::OffsetTombstone { group: GROUP.into(), topic: "t".into(), partition: 0 });
    assert!(w.restarted().c.group(GROUP).is_none(), "and stays gone after a restart");
}

#[test]
fn a_simple_commit_expires_by_its_own_age_and_a_v2_retention_by_its_own_time() {
    let retention = Duration::from_secs(3600);
    let check = Duration::from_secs(60);
    let mut w =
        World::with(Settings { offsets_retention: retention, offsets_retention_check_interval: check, ..settings() });
    assert_eq!(w.commit(8, &simple(&[("t", 0, 1)])), [0]);
    let mut short = simple(&[("t", 1, 2)]);
    short.retention_time_ms = 120_000;
    assert_eq!(w.commit(2, &short), [0]);
    w.advance(Duration::from_secs(30 * 60));
    assert_eq!(w.commit(8, &simple(&[("t", 2, 3)])), [0]);
    assert_eq!((w.committed("t", 0), w.committed("t", 1)), (1, -1), "two minutes were asked for t-1");
    w.advance(Duration::from_secs(31 * 60));
    assert_eq!((w.committed("t", 0), w.committed("t", 2)), (-1, 3), "an hour after each commit");
    // After a restart, retention counts from the restart (the group's history is unknown).
    let mut after = w.restarted();
    after.advance(Duration::from_secs(40 * 60));
    assert_eq!(after.committed("t", 2), 3);
    after.advance(Duration::from_secs(21 * 60));
    assert_eq!(after.committed("t", 2), -1);
}

#[test]
fn list_groups_reports_states_and_filters_by_them() {
    let mut w = World::new();
    let mut cs = [Consumer::new("c")];
    w.form(&mut cs);
    assert_eq!(w.commit(8, &simple(&[("t", 0, 1)]).with_group_id(GroupId(s("simple")))), [0]);
    let list = |w: &World, v: i16, filter: &[&str]| {
        let r = wire(&ListGroupsRequest::default().with_states_filter(filter.iter().map(|f| s(f)).collect()), v);
        let r: ListGroupsResponse =
            roundtrip(ApiKey::ListGroups, v, ResponseKind::ListGroups(w.c.handle_list_groups(v, &r)));
        r.groups
            .iter()
            .map(|g| (g.group_id.0.to_string(), g.protocol_type.to_string(), g.group_state.to_string()))
            .collect::<Vec<_>>()
    };
    let both = [
        (GROUP.to_string(), "consumer".to_string(), "Stable".to_string()),
        ("simple".to_string(), String::new(), "Empty".to_string()),
    ];
    assert_eq!(list(&w, 4, &[]), both);
    assert_eq!(list(&w, 4, &["stable"]), both[..1], "case-insensitive");
    assert_eq!(list(&w, 4, &["Empty", "Dead"]), both[1..]);
    assert_eq!(list(&w, 4, &["bogus"]), []);
    let v0 = list(&w, 0, &[]);
    assert_eq!(v0.len(), 2);
    assert_eq!(v0[0].2, "", "no state before v4");
}

/// A committed transaction's offsets land whatever the group's generation is now (they were
/// checked when staged), durably before the answer, and create a group that is gone.
#[test]
fn a_transactions_offsets_apply_to_a_stable_group_and_to_one_that_does_not_exist() {
    let mut w = World::new();
    let mut cs = [Consumer::new("c")];
    w.form(&mut cs);
    assert_eq!(w.commit(8, &simple(&[("t", 0, 5)])), [code(ResponseError::UnknownMemberId)], "a plain one is refused");
    w.hold_persists = true;
    let t = w.token(ApiKey::OffsetCommit, 8);
    let r = simple(&[("t", 0, 7), ("t", 1, 9)]);
    w.c.handle_transaction_offsets(w.now, t, &r);
    w.run();
    assert!(!w.answered(t), "not before the records are durable");
    assert_eq!(w.committed("t", 0), -1);
    w.persist_all();
    assert_eq!(w.commit_codes(t), Some(vec![0, 0]));
    assert_eq!((w.committed("t", 0), w.committed("t", 1)), (7, 9));
    assert_eq!(w.state(), "Stable", "the members are untouched");
    // A group that does not exist (deleted meanwhile) is created for them.
    let other = simple(&[("u", 0, 3)]).with_group_id(GroupId(s("elsewhere")));
    let t = w.token(ApiKey::OffsetCommit, 8);
    w.c.handle_transaction_offsets(w.now, t, &other);
    w.run();
    w.persist_all();
    assert_eq!(w.commit_codes(t), Some(vec![0]));
    let fetched = w
        .c
        .handle_offset_fetch(7, &wire(&fetch_request(Some(&[("u", &[0])])).with_group_id(GroupId(s("elsewhere"))), 7));
    assert_eq!(fetched.topics[0].partitions[0].committed_offset, 3);
}
