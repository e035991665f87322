//! Arbitrary conversations: members of every version joining, syncing, heartbeating, leaving,
//! committing, restarting and vanishing, with time passing, connections closing and persists
//! held or failing. After every step the harness checks the coordinator's bookkeeping and that
//! every answer encodes at its version; at the end the offsets in memory are those a restart
//! restores from the log.

use proptest::prelude::*;

use super::*;

#[derive(Debug, Clone)]
enum Op {
    Join(usize),
    /// The member's process restarts: it forgets its member id.
    Restart(usize),
    Sync(usize),
    Heartbeat(usize),
    Leave(usize, i16),
    Commit(usize, i64),
    SimpleCommit(i64),
    Advance(u64),
    CancelLast,
    HoldPersists(bool),
    FailFirstPersist,
    Delete,
    Read,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..4usize).prop_map(Op::Join),
        1 => (0..4usize).prop_map(Op::Restart),
        3 => (0..4usize).prop_map(Op::Sync),
        2 => (0..4usize).prop_map(Op::Heartbeat),
        1 => (0..4usize, 0..=4i16).prop_map(|(i, v)| Op::Leave(i, v)),
        2 => (0..4usize, 0..1000i64).prop_map(|(i, o)| Op::Commit(i, o)),
        1 => (0..1000i64).prop_map(Op::SimpleCommit),
        3 => prop_oneof![Just(0u64), 1..3_000u64, 3_000..40_000u64].prop_map(Op::Advance),
        1 => Just(Op::CancelLast),
        1 => any::<bool>().prop_map(Op::HoldPersists),
        1 => Just(Op::FailFirstPersist),
        1 => Just(Op::Delete),
        1 => Just(Op::Read),
    ]
}

fn consumer() -> impl Strategy<Value = Consumer> {
    (0..=7i16, any::<bool>(), 0..3usize).prop_map(|(v, is_static, p)| {
        let names = [&["range"][..], &["range", "roundrobin"], &["roundrobin", "range"]][p];
        let mut c = Consumer::new("c").version(v).protocols(names);
        if is_static && v >= 5 {
            c = c.instance("i");
        }
        c
    })
}

/// What a token was for, to update its consumer with the answer.
enum Sent {
    Join(usize),
    Other,
}

fn run(mut consumers: Vec<Consumer>, ops: Vec<Op>) {
    let mut w = World::with(Settings { initial_rebalance_delay: Duration::from_millis(500), ..settings() });
    for (i, c) in consumers.iter_mut().enumerate() {
        c.client_id = format!("c{i}");
        if let Some(instance) = &mut c.instance_id {
            *instance = format!("i{i}");
        }
    }
    let mut sent: Vec<(RequestToken, Sent)> = Vec::new();
    for op in ops {
        match op {
            Op::Join(i) => {
                let t = w.send_join(&consumers[i]);
                sent.push((t, Sent::Join(i)));
            }
            Op::Restart(i) => {
                consumers[i].member_id.clear();
                consumers[i].generation = -1;
            }
            Op::Sync(i) => {
                // A leader assigns to every member it knows of.
                let members: Vec<String> = match w.c.group(GROUP) {
                    Some(g) if g.leader == Some(consumers[i].member_id.as_str()) => {
                        g.members.iter().map(|m| m.member_id.to_owned()).collect()
                    }
                    _ => Vec::new(),
                };
                let assignments: Vec<(&str, &[u8])> = members.iter().map(|m| (m.as_str(), &b"a"[..])).collect();
                let t = w.send_sync(&consumers[i], &assignments);
                sent.push((t, Sent::Other));
            }
            Op::Heartbeat(i) => {
                w.heartbeat(&consumers[i]);
            }
            Op::Leave(i, v) => {
                let c = &consumers[i];
                let instance = if v >= 3 { c.instance_id.as_deref() } else { None };
                w.leave(v, &[(&c.member_id, instance)]);
            }
            Op::Commit(i, offset) => {
                let v = if consumers[i].instance_id.is_some() { 8 } else { 2 + (offset % 7) as i16 };
                let t = w.send_commit(v, &consumers[i].commit_request(&[("t", (offset % 3) as i32, offset)]));
                sent.push((t, Sent::Other));
            }
            Op::SimpleCommit(offset) => {
                let t = w.send_commit(8, &commit_request(-1, "", None, &[("t", (offset % 3) as i32, offset)]));
                sent.push((t, Sent::Other));
            }
            Op::Advance(ms) => w.advance(Duration::from_millis(ms)),
            Op::CancelLast => {
                if let Some((t, _)) = sent.pop()
                    && w.in_flight(t)
                {
                    w.c.cancel(t);
                }
            }
            Op::HoldPersists(hold) => {
                w.hold_persists = hold;
                w.run();
            }
            Op::FailFirstPersist => {
                if let Some((id, _)) = w.persists.pop_front() {
                    w.c.handle_persist_failed(id);
                    w.run();
                }
            }
            Op::Delete => {
                let t = w.send_delete(2, &[GROUP]);
                sent.push((t, Sent::Other));
            }
            Op::Read => {
                w.describe(5);
                w.fetch(7, None);
                w.fetch(1, Some(&[("t", &[0, 1, 2])]));
            }
        }
        for (t, what) in &sent {
            if let Sent::Join(i) = what
                && w.answered(*t)
            {
                w.join_answer(*t, &mut consumers[*i]);
            }
        }
        sent.retain(|(t, _)| w.in_flight(*t));
    }
    w.hold_persists = false;
    w.run();
    let after = w.restarted();
    let held: Vec<Record> = w.c.snapshot().collect();
    let restored: Vec<Record> = after.c.snapshot().collect();
    let key = |r: &Record| format!("{r:?}");
    let (mut held, mut restored) = (held, restored);
    held.sort_by_key(key);
    restored.sort_by_key(key);
    assert_eq!(held, restored, "memory holds what a restart restores from the log");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_conversations_keep_the_coordinator_consistent(
        consumers in proptest::collection::vec(consumer(), 4),
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        run(consumers, ops);
    }
}
