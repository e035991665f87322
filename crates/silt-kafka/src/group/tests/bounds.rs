//! Everything a client makes the coordinator keep is bounded, and refused past the bound with
//! Kafka's error for it (INVALID_REQUEST where Kafka has none).

use super::*;

fn join_code(w: &mut World, c: &mut Consumer) -> i16 {
    let t = w.send_join(c);
    w.join_answer(t, c).expect("answered at once").error_code
}

#[test]
fn join_group_fields_over_their_bounds_are_refused() {
    let mut w =
        World::with(Settings { max_protocols: 2, max_member_metadata_bytes: 100, max_name_bytes: 20, ..settings() });
    let invalid = code(ResponseError::InvalidRequest);
    let mut many = Consumer::new("c").protocols(&["a", "b", "c"]);
    assert_eq!(join_code(&mut w, &mut many), invalid, "too many protocols");
    let mut fat = Consumer::new("c");
    fat.protocols = vec![("range".into(), Bytes::from(vec![0; 60])), ("sticky".into(), Bytes::from(vec![0; 41]))];
    assert_eq!(join_code(&mut w, &mut fat), invalid, "metadata over the bound, summed over protocols");
    let mut long = Consumer::new("c").protocols(&["a-protocol-name-longer-than-twenty"]);
    assert_eq!(join_code(&mut w, &mut long), invalid, "protocol name");
    let mut instance = Consumer::new("c").instance(&"i".repeat(21));
    assert_eq!(join_code(&mut w, &mut instance), invalid, "group instance id");
    let mut twice = Consumer::new("c").protocols(&["range", "range"]);
    assert_eq!(join_code(&mut w, &mut twice), invalid, "a protocol named twice");
    assert!(w.c.group(GROUP).is_none(), "nothing was kept");
    let mut fine = Consumer::new("c").protocols(&["a", "b"]);
    let t = w.join(&mut fine);
    assert_eq!(w.join_answer(t, &mut fine).unwrap().error_code, 0);
}

#[test]
fn a_group_id_over_its_bound_is_invalid() {
    let mut w = World::with(Settings { max_group_id_bytes: 8, ..settings() });
    let long = GroupId(s("123456789"));
    let invalid = code(ResponseError::InvalidGroupId);
    let t = w.token(ApiKey::JoinGroup, 7);
    w.c.handle_join_group(
        w.now,
        t,
        7,
        World::client("c"),
        &Consumer::new("c").join_request().with_group_id(long.clone()),
    );
    w.run();
    let Some(ResponseKind::JoinGroup(r)) = w.take(t) else { panic!() };
    assert_eq!(r.error_code, invalid);
    assert_eq!(w.commit(8, &commit_request(-1, "", None, &[("t", 0, 1)]).with_group_id(long.clone())), [invalid]);
    let r = w.c.handle_heartbeat(w.now, 4, &HeartbeatRequest::default().with_group_id(long.clone()));
    assert_eq!(r.error_code, invalid);
    assert_eq!(w.c.groups().count(), 0);
}

#[test]
fn an_assignment_over_its_bound_fails_the_leaders_sync_group_only() {
    let mut w = World::with(Settings { max_assignment_bytes: 16, ..settings() });
    let mut cs = [Consumer::new("c1"), Consumer::new("c2")];
    w.join_all(&mut cs);
    let s2 = w.send_sync(&cs[1], &[]);
    let big = [0u8; 17];
    let s1 = w.send_sync(&cs[0], &[(&cs[0].member_id, b"ok"), (&cs[1].member_id, &big)]);
    assert_eq!(w.sync_answer(s1).unwrap().error_code, code(ResponseError::InvalidRequest));
    assert!(!w.answered(s2), "the follower still waits");
    assert_eq!(w.state(), "CompletingRebalance");
    let s1 = w.send_sync(&cs[0], &[(&cs[1].member_id, b"fits")]);
    assert_eq!(w.sync_answer(s1).unwrap().error_code, 0);
    assert_eq!(&w.sync_answer(s2).unwrap().assignment[..], b"fits");
}

#[test]
fn the_number_of_groups_is_bounded() {
    let mut w = World::with(Settings { max_groups: 2, ..settings() });
    for g in ["a", "b"] {
        assert_eq!(w.commit(8, &commit_request(-1, "", None, &[("t", 0, 1)]).with_group_id(GroupId(s(g)))), [0]);
    }
    let busy = code(ResponseError::CoordinatorNotAvailable);
    assert_eq!(w.commit(8, &commit_request(-1, "", None, &[("t", 0, 1)]).with_group_id(GroupId(s("c")))), [busy]);
    let mut c = Consumer::new("c");
    assert_eq!(join_code(&mut w, &mut c), busy, "a new group is refused too; clients retry");
    // Existing groups go on.
    assert_eq!(w.commit(8, &commit_request(-1, "", None, &[("t", 0, 2)]).with_group_id(GroupId(s("a")))), [0]);
    assert_eq!(w.delete(&["a"]), [0]);
    assert_eq!(join_code(&mut w, &mut c), code(ResponseError::MemberIdRequired), "room again");
}

#[test]
fn members_over_all_groups_are_bounded() {
    let mut w = World::with(Settings { max_members: 2, ..settings() });
    let mut cs = [Consumer::new("c1"), Consumer::new("c2")];
    w.form(&mut cs);
    let mut other = Consumer::new("x");
    let t = w.token(ApiKey::JoinGroup, 7);
    w.c.handle_join_group(w.now, t, 7, World::client("x"), &other.join_request().with_group_id(GroupId(s("other"))));
    w.run();
    let r = w.join_answer(t, &mut other).unwrap();
    assert_eq!(r.error_code, code(ResponseError::GroupMaxSizeReached));
    w.leave(3, &[(&cs[1].member_id, None)]);
    assert_eq!(w.c.member_count(), 1);
}

#[test]
fn members_told_member_id_required_count_against_the_group_size() {
    let mut w = World::with(Settings { max_group_size: 3, ..settings() });
    let mut cs = [Consumer::new("c1")];
    cs[0].session = Duration::from_secs(60);
    w.form(&mut cs);
    let full = code(ResponseError::GroupMaxSizeReached);
    let mut codes = Vec::new();
    for i in 0..4 {
        let mut c = Consumer::new(&format!("p{i}"));
        codes.push(join_code(&mut w, &mut c));
    }
    let required = code(ResponseError::MemberIdRequired);
    assert_eq!(codes, [required, required, full, full], "one member and two pending fill a group of three");
    w.advance(SESSION);
    assert_eq!(w.c.member_count(), 1, "pending members that never rejoin expire");
}

#[test]
fn client_ids_and_hosts_are_cut_where_they_are_kept() {
    let mut w = World::with(Settings { max_name_bytes: 10, ..settings() });
    let id = "é".repeat(20);
    let mut c = Consumer::new(&id);
    let t = w.token(ApiKey::JoinGroup, 3);
    w.c.handle_join_group(
        w.now,
        t,
        3,
        Client { client_id: &id, client_host: &"h".repeat(50) },
        &wire(&c.join_request(), 3),
    );
    w.run();
    let r = w.join_answer(t, &mut c).unwrap();
    assert_eq!(r.error_code, 0);
    assert!(r.member_id.starts_with(&format!("{}-", "é".repeat(5))), "{}", r.member_id);
    let d = w.describe(5);
    assert_eq!((d.members[0].client_id.as_str(), d.members[0].client_host.len()), ("é".repeat(5).as_str(), 10));
}

#[test]
fn a_group_named_many_times_is_described_once() {
    let mut w = World::new();
    let mut cs = [Consumer::new("c")];
    w.form(&mut cs);
    let r = DescribeGroupsRequest::default().with_groups(vec![GroupId(s(GROUP)); 1000]);
    assert_eq!(w.c.handle_describe_groups(5, &r).groups.len(), 1);
}

#[test]
fn the_deadline_index_holds_no_stale_entries() {
    let mut w = World::new();
    let mut cs = [Consumer::new("c1"), Consumer::new("c2"), Consumer::new("c3")];
    w.form(&mut cs);
    for _ in 0..20 {
        w.advance(Duration::from_secs(1));
        for c in &cs {
            w.heartbeat(c);
        }
    }
    // One session per member and the retention check: the heartbeats replaced their entries.
    assert_eq!(w.c.core.timers.len(), 4);
    w.leave(3, &cs.iter().map(|c| (c.member_id.as_str(), None)).collect::<Vec<_>>());
    assert_eq!(w.c.core.timers.len(), 1);
}

#[test]
fn stored_fields_do_not_keep_the_request_frame() {
    let mut w = World::new();
    let mut c = Consumer::new("c").version(3);
    let frame = Bytes::from(vec![7u8; 4096]);
    let mut r = c.join_request();
    r.protocols[0].metadata = frame.slice(..8);
    let t = w.token(ApiKey::JoinGroup, 3);
    w.c.handle_join_group(w.now, t, 3, World::client("c"), &r);
    w.run();
    w.join_answer(t, &mut c).unwrap();
    drop(r);
    // Only `frame` itself still refers to its buffer.
    assert!(frame.is_unique(), "the coordinator copied what it kept");
}
