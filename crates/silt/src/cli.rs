//! `silt status`, `silt sessions`, ...: the command-line client of a running node's gRPC admin
//! API ([`crate::grpc`]). Tables for people, `--json` (one document on stdout) for scripts.
//! Exits 1 with the gRPC code and message on stderr when the node refuses.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use serde::Serialize;
use tonic::Status;
use tonic::metadata::MetadataValue;

use crate::grpc::pb;
use pb::admin_client::AdminClient;

/// How to reach the node, for every command.
#[derive(clap::Args, Debug)]
pub struct Conn {
    /// The node's admin listener (`admin.listen`).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    admin: String,
    /// A file holding the bearer token (the node's `admin.token_file`).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// A running node: id, epoch, version, uptime, listeners.
    Status {
        #[command(flatten)]
        conn: Conn,
    },
    /// Streams (MQTT topics and Kafka topics) and their policies, or one stream.
    Streams {
        name: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// MQTT sessions, online and offline, with their backlogs; or one session.
    Sessions {
        client_id: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Closes an MQTT client's connection (its persistent session stays).
    Disconnect {
        client_id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Ends an offline MQTT session as a clean-start connect would (subscriptions and backlog
    /// dropped).
    DeleteSession {
        client_id: String,
        /// Disconnect the client first if it is online.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Kafka consumer groups with their committed offsets and lag, or one group.
    Groups {
        group: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Moves a consumer group's offsets on a topic; the group must have no active members.
    #[command(group(clap::ArgGroup::new("to").required(true)))]
    ResetOffsets {
        group: String,
        topic: String,
        /// To each partition's first offset.
        #[arg(long, group = "to")]
        to_earliest: bool,
        /// To each partition's end.
        #[arg(long, group = "to")]
        to_latest: bool,
        /// To the first record at or after this time (ms since the Unix epoch).
        #[arg(long, group = "to", value_name = "MS")]
        to_datetime: Option<i64>,
        #[command(flatten)]
        conn: Conn,
    },
    /// A topic's partitions' first or end offsets, or the first offset at or after a time.
    #[command(group(clap::ArgGroup::new("at").required(true)))]
    Offsets {
        topic: String,
        #[arg(long, group = "at")]
        earliest: bool,
        #[arg(long, group = "at")]
        latest: bool,
        /// Ms since the Unix epoch; -1 where no record is that recent.
        #[arg(long, group = "at", value_name = "MS")]
        time: Option<i64>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Writes the MQTT messages of the topics matching FILTER, published in [--since, --until),
    /// as JSON lines or Parquet; topic by topic (in topic order), each in publish order. Reads
    /// through the object store for segments no longer on the node's disk.
    ///
    /// JSON lines: one object per record with topic, offset, timestamp_ms, qos, retain,
    /// payload, payload_encoding ("utf8": the payload is the text itself; "base64": it was not
    /// valid UTF-8), user_properties ([name, value] pairs), and when present content_type,
    /// response_topic, correlation_data (base64), message_expiry, payload_format_utf8 and key
    /// (base64, a Kafka-produced record's). Parquet: the lakehouse tables' envelope columns.
    /// A progress bar on stderr when it is a terminal; a summary line on stderr at the end.
    Export {
        /// An MQTT topic filter (+ and # wildcards); `$SYS/...` only when it starts with `$`.
        filter: String,
        /// From this time (ms since the epoch, RFC 3339, or a duration ago: 30s, 15m, 2h, 7d);
        /// default: the beginning.
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
        /// Up to this time, exclusive (same forms); default: now.
        #[arg(long, value_name = "TIME")]
        until: Option<String>,
        #[arg(long, value_enum, default_value = "jsonl")]
        format: crate::export_cli::Format,
        /// Write here instead of stdout (required for parquet).
        #[arg(long, short, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Records per message from the node (it caps this).
        #[arg(long, value_name = "N", default_value_t = 500)]
        batch: u32,
        #[command(flatten)]
        conn: Conn,
    },
    /// Seals the commitlog's active segment now.
    RollSegment {
        #[command(flatten)]
        conn: Conn,
    },
}

impl Command {
    fn conn(&self) -> &Conn {
        match self {
            Command::Status { conn }
            | Command::Streams { conn, .. }
            | Command::Sessions { conn, .. }
            | Command::Disconnect { conn, .. }
            | Command::DeleteSession { conn, .. }
            | Command::Groups { conn, .. }
            | Command::ResetOffsets { conn, .. }
            | Command::Offsets { conn, .. }
            | Command::Export { conn, .. }
            | Command::RollSegment { conn } => conn,
        }
    }
}

/// Runs one command against the node; the exit code says whether it did.
pub fn run(cmd: Command) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("silt: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(call(&cmd)) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(Failure::Local(e)) => {
            eprintln!("silt: {e:#}");
            ExitCode::FAILURE
        }
        Err(Failure::Refused(s)) => {
            eprintln!("silt: {:?}: {}", s.code(), s.message());
            ExitCode::FAILURE
        }
    }
}

pub(crate) enum Failure {
    Local(anyhow::Error),
    Refused(Status),
}

impl From<Status> for Failure {
    fn from(s: Status) -> Self {
        Failure::Refused(s)
    }
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure::Local(e)
    }
}

/// Adds the bearer token to each call.
type Authorize = Box<dyn FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, Status> + Send>;
pub(crate) type Client =
    AdminClient<tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Authorize>>;

async fn connect(conn: &Conn) -> anyhow::Result<Client> {
    let bearer = match &conn.token_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("--token-file: cannot read {}: {e}", path.display()))?;
            let value: MetadataValue<_> = format!("Bearer {}", text.trim())
                .parse()
                .map_err(|_| anyhow::anyhow!("--token-file: {} does not hold a valid token", path.display()))?;
            Some(value)
        }
        None => None,
    };
    let url = format!("http://{}", conn.admin);
    let channel = tonic::transport::Endpoint::from_shared(url)
        .map_err(|e| anyhow::anyhow!("--admin {}: {e}", conn.admin))?
        .connect_timeout(std::time::Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach the admin listener at {}: {e}", conn.admin))?;
    let add: Authorize = Box::new(move |mut req: tonic::Request<()>| {
        if let Some(v) = &bearer {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    });
    // An export batch is cut after 1 MiB of payload, so it holds at most that plus one record,
    // and a record is at most an MQTT packet (256 MiB): above tonic's 4 MiB default.
    Ok(AdminClient::with_interceptor(channel, add).max_decoding_message_size(MAX_REPLY))
}

/// The largest admin reply the CLI accepts (an export batch; see above).
const MAX_REPLY: usize = 257 << 20;

fn json(v: &impl Serialize) -> Result<String, Failure> {
    serde_json::to_string_pretty(v).map(|s| s + "\n").map_err(|e| Failure::Local(e.into()))
}

async fn call(cmd: &Command) -> Result<String, Failure> {
    let conn = cmd.conn();
    let mut c = connect(conn).await?;
    let as_json = conn.json;
    match cmd {
        Command::Status { .. } => {
            let s = c.status(pb::StatusRequest {}).await?.into_inner();
            if as_json {
                return json(&s);
            }
            let mut out = table(
                &["NODE", "EPOCH", "VERSION", "UPTIME", "SESSIONS", "SEGMENTS", "OBJECT STORE"],
                vec![vec![
                    s.node_id.clone(),
                    s.epoch.to_string(),
                    s.version.clone(),
                    uptime(s.uptime_secs),
                    s.sessions.to_string(),
                    s.log_segments.to_string(),
                    s.object_store.clone(),
                ]],
            );
            out.push('\n');
            out += &table(
                &["LISTENER", "ADDRESS"],
                s.listeners.iter().map(|l| vec![l.protocol.clone(), l.address.clone()]).collect(),
            );
            Ok(out)
        }
        Command::Streams { name, .. } => {
            let streams = match name {
                Some(name) => {
                    vec![c.describe_stream(pb::DescribeStreamRequest { name: name.clone() }).await?.into_inner()]
                }
                None => c.list_streams(pb::ListStreamsRequest {}).await?.into_inner().streams,
            };
            if as_json {
                return match name {
                    Some(_) => json(&streams[0]),
                    None => json(&streams),
                };
            }
            Ok(table(
                &[
                    "STREAM",
                    "PARTITIONS",
                    "TIER",
                    "ACK",
                    "RETENTION MS",
                    "RETENTION BYTES",
                    "LOCAL BYTES",
                    "BUCKET BYTES",
                    "TABLE",
                ],
                streams
                    .into_iter()
                    .map(|s| {
                        vec![
                            s.name,
                            s.partitions.to_string(),
                            s.tier,
                            s.ack,
                            limit(s.retention_ms),
                            limit(s.retention_bytes),
                            s.local_bytes.to_string(),
                            s.bucket_bytes.to_string(),
                            dash(s.lakehouse_table),
                        ]
                    })
                    .collect(),
            ))
        }
        Command::Sessions { client_id, .. } => {
            let sessions = match client_id {
                Some(id) => {
                    vec![c.describe_session(pb::DescribeSessionRequest { client_id: id.clone() }).await?.into_inner()]
                }
                None => c.list_sessions(pb::ListSessionsRequest {}).await?.into_inner().sessions,
            };
            if as_json {
                return match client_id {
                    Some(_) => json(&sessions[0]),
                    None => json(&sessions),
                };
            }
            Ok(table(
                &["CLIENT ID", "ONLINE", "BACKLOG", "SUBSCRIPTIONS"],
                sessions
                    .into_iter()
                    .map(|s| {
                        vec![
                            s.client_id,
                            if s.online { "yes" } else { "no" }.to_owned(),
                            s.backlog.to_string(),
                            dash(s.subscriptions.join(" ")),
                        ]
                    })
                    .collect(),
            ))
        }
        Command::Disconnect { client_id, .. } => {
            c.disconnect_client(pb::DisconnectClientRequest { client_id: client_id.clone() }).await?;
            if as_json {
                return json(&serde_json::json!({"client_id": client_id, "disconnected": true}));
            }
            Ok(format!("disconnected {client_id}\n"))
        }
        Command::DeleteSession { client_id, force, .. } => {
            let r = c
                .delete_session(pb::DeleteSessionRequest { client_id: client_id.clone(), force: *force })
                .await?
                .into_inner();
            if as_json {
                return json(
                    &serde_json::json!({"client_id": client_id, "deleted": true, "disconnected": r.disconnected}),
                );
            }
            Ok(match r.disconnected {
                true => format!("disconnected {client_id} and deleted its session\n"),
                false => format!("deleted the session of {client_id}\n"),
            })
        }
        Command::Groups { group, .. } => {
            let groups = match group {
                Some(id) => vec![c.describe_group(pb::DescribeGroupRequest { group: id.clone() }).await?.into_inner()],
                None => c.list_groups(pb::ListGroupsRequest {}).await?.into_inner().groups,
            };
            if as_json {
                return match group {
                    Some(_) => json(&groups[0]),
                    None => json(&groups),
                };
            }
            let mut rows = Vec::new();
            for g in groups {
                let head = [g.group.clone(), g.state.clone(), g.members.len().to_string()];
                if g.offsets.is_empty() {
                    rows.push(head.iter().cloned().chain(["-", "-", "-", "-", "-"].map(String::from)).collect());
                }
                for o in g.offsets {
                    let cells = [
                        o.topic,
                        o.partition.to_string(),
                        o.committed.to_string(),
                        o.end.to_string(),
                        o.lag.to_string(),
                    ];
                    rows.push(head.iter().cloned().chain(cells).collect());
                }
            }
            Ok(table(&["GROUP", "STATE", "MEMBERS", "TOPIC", "PARTITION", "COMMITTED", "END", "LAG"], rows))
        }
        Command::ResetOffsets { group, topic, to_earliest, to_latest, to_datetime, .. } => {
            use pb::reset_group_offsets_request::To;
            let to = match (to_earliest, to_latest, to_datetime) {
                (true, _, _) => To::Earliest(true),
                (_, true, _) => To::Latest(true),
                (_, _, Some(ms)) => To::TimestampMs(*ms),
                _ => return Err(Failure::Local(anyhow::anyhow!("one of --to-earliest, --to-latest, --to-datetime"))),
            };
            let r = c
                .reset_group_offsets(pb::ResetGroupOffsetsRequest {
                    group: group.clone(),
                    topic: topic.clone(),
                    to: Some(to),
                })
                .await?
                .into_inner();
            if as_json {
                return json(&r.offsets);
            }
            Ok(table(
                &["GROUP", "TOPIC", "PARTITION", "NEW OFFSET"],
                r.offsets
                    .into_iter()
                    .map(|o| vec![group.clone(), o.topic, o.partition.to_string(), o.offset.to_string()])
                    .collect(),
            ))
        }
        Command::Offsets { topic, earliest, latest, time, .. } => {
            use pb::list_offsets_request::At;
            let at = match (earliest, latest, time) {
                (true, _, _) => At::Earliest(true),
                (_, true, _) => At::Latest(true),
                (_, _, Some(ms)) => At::TimestampMs(*ms),
                _ => return Err(Failure::Local(anyhow::anyhow!("one of --earliest, --latest, --time"))),
            };
            let r = c.list_offsets(pb::ListOffsetsRequest { topic: topic.clone(), at: Some(at) }).await?.into_inner();
            if as_json {
                return json(&r.offsets);
            }
            Ok(table(
                &["TOPIC", "PARTITION", "OFFSET"],
                r.offsets.into_iter().map(|o| vec![o.topic, o.partition.to_string(), o.offset.to_string()]).collect(),
            ))
        }
        Command::Export { filter, since, until, format, output, batch, .. } => {
            let args = crate::export_cli::Args {
                filter,
                since: since.as_deref(),
                until: until.as_deref(),
                format: *format,
                output: output.as_ref(),
                batch: *batch,
            };
            let s = crate::export_cli::run(&mut c, args).await?;
            if as_json {
                let summary = serde_json::json!({"records": s.records, "bytes": s.bytes, "topics": s.topics});
                eprintln!("{summary}");
            } else {
                eprintln!("exported {} records ({} payload bytes) from {} topics", s.records, s.bytes, s.topics);
            }
            Ok(String::new())
        }
        Command::RollSegment { .. } => {
            let r = c.roll_segment(pb::RollSegmentRequest {}).await?.into_inner();
            if as_json {
                return json(&r);
            }
            Ok(format!("rolled: sealed segments end at log position {}; {} segments\n", r.sealed_end, r.segments))
        }
    }
}

fn dash(s: String) -> String {
    if s.is_empty() { "-".to_owned() } else { s }
}

/// 0 is "no limit" in a policy.
fn limit(v: u64) -> String {
    if v == 0 { "-".to_owned() } else { v.to_string() }
}

fn uptime(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{}s", s / 60, s % 60),
        s if s < 86_400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        s => format!("{}d{}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// Left-aligned columns two spaces apart, a header line first.
fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        out += line.join("  ").trim_end();
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_columns_line_up() {
        let t = table(&["A", "LONG NAME"], vec![vec!["wide cell".into(), "x".into()], vec!["b".into(), "y".into()]]);
        assert_eq!(t, "A          LONG NAME\nwide cell  x\nb          y\n");
    }
}
