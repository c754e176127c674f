//! The subcommands that talk to a broker-server (and `size`, which does not).

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use broker_client::{
    Assignor, BrokerRecord, Client, Consumer, ConsumerStatus, Delivery, Discard, Error,
    GroupDescription, GroupSetting, GroupSettings, Header, KafkaGroupDescription, KeyHash,
    PublishRecord, ResetTo, StartAt, TopicSetting, TopicSettings, MAX_POLL_RECORDS,
};

use crate::connect::Server;
use futures::stream::{self, StreamExt, TryStreamExt};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use crate::cli::{
    AssignorArg, ClusterCommand, Command, ConfigureArgs, ConfigureTopicArgs, ConnectArgs,
    ConsumeArgs, ConsumeMode, CreateArgs, DeleteArgs, DescribeArgs, DiscardArg, GroupArgs,
    GroupCommand, GroupDeleteArgs, JoinArgs, KeyHashArg, LagArgs, LimitArgs, MemberArgs,
    OffsetsArgs, PingArgs, ProducersArgs, PublishArgs, PurgeArgs, ResetArgs, SizeArgs, StartAtArg,
};
use crate::retention::RetentionArg;
use crate::{bench, cluster, output, size};

/// How many publishes `broker publish` keeps in flight on its connection.
const PUBLISH_PIPELINE: usize = 256;
/// How long one waiting poll or fetch of `consume --follow` waits before asking again.
const FOLLOW_WAIT: Duration = Duration::from_secs(5);

/// Runs one parsed command with the connection options it was given (`None` only for a
/// command that talks to no server).
pub async fn run(connect: Option<ConnectArgs>, command: Command) -> anyhow::Result<()> {
    let server = match connect {
        Some(connect) => Server {
            addr: connect.addr,
            auth_token: broker_net::auth_token(connect.auth_token_file.as_deref())?,
            tls_ca: connect.tls_ca,
            tls_server_name: connect.tls_server_name,
        },
        None => {
            let Command::Size(args) = command else {
                bail!("no connection options for a command that connects");
            };
            return size_command(&args);
        }
    };
    match command {
        Command::Size(args) => size_command(&args),
        Command::Ping(c) => ping(&server, c.args).await,
        Command::Top(c) => crate::top::run(&server.connect().await?, c.args).await,
        Command::Bench(c) => {
            let handles = c.args.handles;
            bench::run(&server, c.args).await.map_err(|error| {
                let lost = error.chain().any(|cause| {
                    matches!(
                        cause.downcast_ref::<broker_client::Error>(),
                        Some(broker_client::Error::ConnectionLost(_))
                    )
                });
                match lost && !handles {
                    // The low-level calls are not tried again: a lost connection (a cluster's
                    // failover, say) ends the run.
                    true => error.context(
                        "the run ends at a lost connection; with --handles, its Producer and \
                         Consumer follow a cluster's new leader and the run goes on",
                    ),
                    false => error,
                }
            })
        }
        Command::Create(c) => create(&server.connect().await?, c.args).await,
        Command::Configure(c) => configure_topic(&server.connect().await?, c.args).await,
        Command::Delete(c) => delete(&server.connect().await?, c.args).await,
        Command::Purge(c) => purge(&server.connect().await?, c.args).await,
        Command::Group(GroupCommand::Reset(c)) => reset(&server.connect().await?, c.args).await,
        Command::Group(GroupCommand::Delete(c)) => {
            delete_group(&server.connect().await?, c.args).await
        }
        Command::Group(GroupCommand::Configure(c)) => {
            configure_group(&server.connect().await?, c.args).await
        }
        Command::Offsets(c) => offsets(&server.connect().await?, c.args).await,
        Command::Producers(c) => producers(&server.connect().await?, c.args).await,
        Command::Publish(c) => publish(&server.connect().await?, c.args).await,
        Command::Consume(c) => consume(&server.connect().await?, c.args).await,
        Command::Join(c) => join(&server.connect().await?, c.args).await,
        Command::Leave(c) => leave(&server.connect().await?, c.args).await,
        Command::Describe(c) => describe(&server.connect().await?, c.args).await,
        Command::Lag(c) => lag(&server.connect().await?, c.args).await,
        Command::Cluster(ClusterCommand::Status(c)) => cluster::status(&server, c.args).await,
        Command::Cluster(ClusterCommand::Topics(c)) => cluster::topics(&server, c.args).await,
        Command::Cluster(ClusterCommand::Add(c)) => cluster::add(&server, c.args).await,
        Command::Cluster(ClusterCommand::Remove(c)) => cluster::remove(&server, c.args).await,
        Command::Cluster(ClusterCommand::Transfer(c)) => cluster::transfer(&server, c.args).await,
        Command::Cluster(ClusterCommand::Move(c)) => cluster::move_topic(&server, c.args).await,
        Command::Cluster(ClusterCommand::Balance(c)) => cluster::balance(&server, c.args).await,
    }
}

/// `broker group configure`: the group's settings with the ones named changed.
async fn configure_group(client: &Client, args: ConfigureArgs) -> anyhow::Result<()> {
    let GroupArgs { topic, group } = &args.group;
    let known = client.describe_topic(topic).await?.groups;
    let Some(current) = known.iter().find(|described| described.name == *group) else {
        return Err(unknown_group(topic, group, &known));
    };
    let current = current.settings.clone();
    let mut settings = GroupSettings::from_list(&current)?;
    if let Some(timeout) = args.ack_timeout {
        settings.ack_timeout_ms = Some(millis(timeout));
    }
    if args.no_ack_timeout {
        settings.ack_timeout_ms = None;
    }
    if let Some(max) = args.dead_letters.max_deliveries {
        settings.max_deliveries = Some(max);
    }
    if let Some(dead_letter) = args.dead_letters.dead_letter {
        settings.dead_letter = Some(dead_letter);
    }
    if args.no_dead_letter {
        settings.max_deliveries = None;
        settings.dead_letter = None;
    }
    if settings.max_deliveries.is_some() != settings.dead_letter.is_some() {
        bail!(
            "group {group} on {topic} has no dead-letter topic yet: give --max-deliveries and \
             --dead-letter together"
        );
    }
    let now = client
        .configure_group(topic, group, &settings.to_list())
        .await?;
    if args.json {
        outln!("{}", serde_json::to_string(&now)?)?;
    } else {
        outln!(
            "group {group} on {topic}: {}",
            output::group_settings_words(&now)
        )?;
    }
    Ok(())
}

async fn ping(server: &Server, args: PingArgs) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let client = match server.connect().await {
        Ok(client) => client,
        Err(error) => {
            if args.json {
                // A script reading standard output learns why too.
                let json = serde_json::json!({"addr": server.addr, "error": format!("{error:#}")});
                outln!("{json}")?;
            }
            return Err(error);
        }
    };
    let elapsed = started.elapsed();
    let limits = client.server_limits();
    if args.json {
        let json = serde_json::json!({
            "addr": server.addr,
            "answered_by": client.server_addr().to_string(),
            "server": client.server_name(),
            "elapsed_ms": elapsed.as_secs_f64() * 1000.0,
            "limits": limits,
        });
        outln!("{json}")?;
    } else {
        outln!(
            "{} at {} answered in {:.1} ms (connection and hello); it accepts payloads up to {} \
             bytes and frames up to {} bytes",
            client.server_name(),
            client.server_addr(),
            elapsed.as_secs_f64() * 1000.0,
            limits.max_payload_bytes,
            limits.max_frame_bytes
        )?;
    }
    Ok(())
}

impl From<KeyHashArg> for KeyHash {
    fn from(arg: KeyHashArg) -> Self {
        match arg {
            KeyHashArg::Murmur2 => KeyHash::Murmur2,
            KeyHashArg::Fnv1a => KeyHash::Fnv1a,
        }
    }
}

impl From<AssignorArg> for Assignor {
    fn from(arg: AssignorArg) -> Self {
        match arg {
            AssignorArg::RoundRobin => Assignor::RoundRobin,
            AssignorArg::Range => Assignor::Range,
        }
    }
}

impl From<DiscardArg> for Discard {
    fn from(arg: DiscardArg) -> Self {
        match arg {
            DiscardArg::New => Discard::New,
            DiscardArg::Old => Discard::Old,
        }
    }
}

impl From<StartAtArg> for StartAt {
    fn from(arg: StartAtArg) -> Self {
        match arg {
            StartAtArg::Earliest => StartAt::Earliest,
            StartAtArg::Latest => StartAt::Latest,
        }
    }
}

/// Milliseconds of a duration, saturated at `u64::MAX`.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The retention settings `broker create` was given.
fn topic_settings(args: &CreateArgs) -> Vec<TopicSetting> {
    let mut settings = Vec::new();
    if let Some(retention) = args.retention.filter(|&r| r != RetentionArg::Interest) {
        settings.push(TopicSetting::Retention(retention.into()));
    }
    settings.extend(limit_settings(&args.limits));
    settings
}

/// The limits and discard policy the flags name, in the order `TopicSettings::to_list` gives.
fn limit_settings(args: &LimitArgs) -> Vec<TopicSetting> {
    let mut settings = Vec::new();
    if let Some(max) = args.max_records {
        settings.push(TopicSetting::MaxRecords(max));
    }
    if let Some(max) = args.max_bytes {
        settings.push(TopicSetting::MaxBytes(max));
    }
    if let Some(age) = args.max_age {
        settings.push(TopicSetting::MaxAgeMs(millis(age)));
    }
    if let Some(discard) = args.discard {
        settings.push(TopicSetting::Discard(discard.into()));
    }
    settings
}

/// `broker configure`: the topic's settings with the ones named changed.
async fn configure_topic(client: &Client, args: ConfigureTopicArgs) -> anyhow::Result<()> {
    let settings = limit_settings(&args.limits);
    if settings.is_empty() {
        return usage(
            "configure",
            "name a setting to change: --max-records, --max-bytes, --max-age or --discard",
        );
    }
    let now = client.configure_topic(&args.topic, &settings).await?;
    if args.json {
        outln!(
            "{}",
            serde_json::json!({"topic": args.topic, "settings": now})
        )?;
    } else {
        outln!("topic {}: {}", args.topic, output::settings_text(&now))?;
    }
    Ok(())
}

async fn create(client: &Client, args: CreateArgs) -> anyhow::Result<()> {
    let settings = topic_settings(&args);
    let asked = args.partitions.unwrap_or(1);
    let key_hash = args.key_hash.map_or(KeyHash::default(), KeyHash::from);
    let created = client
        .create_topic(&args.topic, asked, key_hash, &settings)
        .await?;
    let topic = client.describe_topic(&args.topic).await?;
    let had = topic.partitions.len() as i32;
    let (result, count) = if created {
        ("created", asked)
    } else {
        let (has, not): (Vec<String>, Vec<String>) =
            differences(&args, &settings, &topic)?.into_iter().unzip();
        if !has.is_empty() {
            bail!(
                "topic {} already exists with {}, not {}: create changes no setting of an \
                 existing topic (`broker configure` changes its limits and --discard; its \
                 retention and key hash never change)",
                args.topic,
                has.join(", "),
                not.join(", ")
            );
        }
        match args.partitions {
            Some(asked) if args.add_partitions && asked > had => {
                let count = client.add_partitions(&args.topic, asked).await?;
                eprintln!(
                    "note: keys now map to other partitions: order per key holds only among \
                     records published from now on"
                );
                ("grown", count)
            }
            Some(asked) if asked < had || (asked > had && !args.add_partitions) => bail!(
                "topic {} already exists with {had} partition{}, not {asked}: {}",
                args.topic,
                output::plural(had),
                if asked < had {
                    "partitions are never removed"
                } else {
                    "add --add-partitions to grow it"
                }
            ),
            _ => ("exists", had),
        }
    };
    if args.json {
        outln!(
            "{}",
            serde_json::json!({
                "topic": args.topic,
                "result": result,
                "partitions": count,
                "settings": topic.settings,
            })
        )?;
        return Ok(());
    }
    match result {
        "created" if settings.is_empty() => outln!(
            "created topic {} with {count} partition{}",
            args.topic,
            output::plural(count)
        )?,
        "created" => outln!(
            "created topic {} with {count} partition{}: {}",
            args.topic,
            output::plural(count),
            output::settings_text(&topic.settings)
        )?,
        "grown" => outln!(
            "topic {} now has {count} partition{} (it had {had})",
            args.topic,
            output::plural(count)
        )?,
        _ => outln!(
            "topic {} already exists as asked: {had} partition{}, {}",
            args.topic,
            output::plural(had),
            output::settings_text(&topic.settings)
        )?,
    }
    Ok(())
}

/// What an existing topic has that `broker create` named otherwise, besides its partition
/// count: (what it has, what was asked), in words.
fn differences(
    args: &CreateArgs,
    settings: &[TopicSetting],
    topic: &broker_client::TopicDescription,
) -> anyhow::Result<Vec<(String, String)>> {
    let mut differences = Vec::new();
    if let Some(asked) = args.key_hash.map(KeyHash::from) {
        if asked != topic.key_hash {
            differences.push((
                format!("key hash {}", topic.key_hash.name()),
                format!("key hash {}", asked.name()),
            ));
        }
    }
    let named_retention = !settings.is_empty() || args.retention.is_some();
    if named_retention
        && broker_client::TopicSettings::from_list(settings)?
            != broker_client::TopicSettings::from_list(&topic.settings)?
    {
        differences.push((
            output::settings_text(&topic.settings),
            output::settings_text(settings),
        ));
    }
    Ok(differences)
}

async fn delete(client: &Client, args: DeleteArgs) -> anyhow::Result<()> {
    if client.delete_topic(&args.topic).await? {
        outln!("deleted topic {}", args.topic)?;
    } else {
        outln!("topic {} does not exist (nothing changed)", args.topic)?;
    }
    Ok(())
}

async fn purge(client: &Client, args: PurgeArgs) -> anyhow::Result<()> {
    let partitions = match args.partition.is_empty() {
        true => (0..client.describe_topic(&args.topic).await?.partitions.len() as i32).collect(),
        false => args.partition.clone(),
    };
    let mut rows = Vec::new();
    for partition in partitions {
        let earliest = client.purge(&args.topic, partition, args.before).await?;
        rows.push((partition, earliest));
    }
    if args.json {
        let rows: Vec<_> = rows
            .iter()
            .map(|(partition, earliest)| {
                serde_json::json!({"partition": partition, "earliest_offset": earliest})
            })
            .collect();
        outln!("{}", serde_json::to_string_pretty(&rows)?)?;
    } else {
        for (partition, earliest) in rows {
            outln!(
                "{} partition {partition}: earliest offset now {earliest}",
                args.topic
            )?;
        }
    }
    Ok(())
}

/// The wall clock in milliseconds since the Unix epoch.
fn now_ms() -> anyhow::Result<i64> {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("the system clock is before 1970")?;
    Ok(i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
}

async fn reset(client: &Client, args: ResetArgs) -> anyhow::Result<()> {
    let to = if args.to_earliest {
        ResetTo::Earliest
    } else if args.to_latest {
        ResetTo::Latest
    } else if let Some(offset) = args.to_offset {
        ResetTo::Offset(offset)
    } else if let Some(time) = args.to_datetime {
        ResetTo::Timestamp(time)
    } else if let Some(ago) = args.by_duration {
        ResetTo::Timestamp(ago_ms(ago)?)
    } else if let Some(shift) = args.shift_by {
        ResetTo::ShiftBy(shift)
    } else {
        // clap requires one of them.
        bail!("say where to: --to-earliest, --to-latest, --to-offset, --to-datetime, --by-duration or --shift-by");
    };
    let GroupArgs { topic, group } = &args.group;
    let partitions = (!args.partition.is_empty()).then_some(args.partition.as_slice());
    let rows = client.reset_group(topic, group, partitions, to).await?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&rows)?)?;
    } else {
        print!("{}", output::lag_text(topic, group, &rows));
    }
    Ok(())
}

async fn delete_group(client: &Client, args: GroupDeleteArgs) -> anyhow::Result<()> {
    let GroupArgs { topic, group } = &args.group;
    if !args.partition.is_empty() {
        let rows = client.delete_offsets(topic, group, &args.partition).await?;
        let partitions: Vec<String> = rows.iter().map(|row| row.partition.to_string()).collect();
        outln!(
            "deleted the offsets of group {group} of {topic} on partition {}",
            partitions.join(", ")
        )?;
        print!("{}", output::lag_text(topic, group, &rows));
    } else if client.delete_group(topic, group).await? {
        outln!("deleted group {group} of {topic}")?;
    } else {
        outln!("group {group} of {topic} does not exist (nothing changed)")?;
    }
    Ok(())
}

/// The time `ago` before now, in milliseconds since the epoch; the epoch itself for longer ago
/// (no record is older).
fn ago_ms(ago: Duration) -> anyhow::Result<i64> {
    let ago = i64::try_from(ago.as_millis()).unwrap_or(i64::MAX);
    Ok(now_ms()?.saturating_sub(ago).max(0))
}

async fn offsets(client: &Client, args: OffsetsArgs) -> anyhow::Result<()> {
    let at = match (args.at, args.ago) {
        (Some(at), _) => at,
        (None, Some(ago)) => ago_ms(ago)?,
        (None, None) => bail!("say when: --at 2026-12-01T09:00:00Z or --ago 1h"),
    };
    let topic = client.describe_topic(&args.topic).await?;
    let mut rows = Vec::new();
    for partition in &topic.partitions {
        let offset = client
            .offset_for_time(&args.topic, partition.partition, at)
            .await?;
        rows.push(serde_json::json!({
            "partition": partition.partition,
            "offset": offset,
            "end_offset": partition.end_offset,
        }));
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&rows)?)?;
    } else {
        print!("{}", output::offsets_text(&args.topic, at, &rows));
    }
    Ok(())
}

async fn producers(client: &Client, args: ProducersArgs) -> anyhow::Result<()> {
    let partitions = match args.partition {
        Some(partition) => vec![partition],
        None => client
            .describe_topic(&args.topic)
            .await?
            .partitions
            .iter()
            .map(|partition| partition.partition)
            .collect(),
    };
    let mut rows = Vec::new();
    for partition in partitions {
        let states = client.producers(&args.topic, partition).await?;
        rows.extend(states.into_iter().map(|state| (partition, state)));
    }
    if args.json {
        let rows: Vec<serde_json::Value> = rows
            .iter()
            .map(|(partition, state)| {
                serde_json::json!({
                    "partition": partition,
                    "producer": state.producer,
                    "next_sequence": state.next_sequence,
                    "last_offset": state.last_offset,
                    "last_seen_ms": state.last_seen_ms,
                })
            })
            .collect();
        outln!("{}", serde_json::to_string_pretty(&rows)?)?;
    } else {
        print!("{}", output::producers_text(&args.topic, &rows));
    }
    Ok(())
}

/// The records `broker publish` was given: its arguments, or standard input split as asked.
/// Standard input is read on a thread of its own, so that each record is published as soon
/// as it is read, while the next one is awaited (`tail -f log | broker publish logs`).
fn payloads(args: &mut PublishArgs) -> stream::BoxStream<'static, io::Result<Vec<u8>>> {
    if !args.payloads.is_empty() {
        let given = std::mem::take(&mut args.payloads);
        return stream::iter(given.into_iter().map(|payload| Ok(payload.into_bytes()))).boxed();
    }
    let (binary, delimiter) = (args.binary, args.delimiter.unwrap_or(b'\n'));
    let (sender, receiver) = tokio::sync::mpsc::channel(PUBLISH_PIPELINE);
    let reader = move || {
        for part in stdin_parts(binary, delimiter) {
            // The command ended (an error): nothing reads further.
            if sender.blocking_send(part).is_err() {
                return;
            }
        }
    };
    // Not a task of the runtime: a read that never ends (a terminal left open) must not keep
    // the command from exiting.
    if let Err(error) = std::thread::Builder::new()
        .name("stdin".into())
        .spawn(reader)
    {
        return stream::iter([Err(error)]).boxed();
    }
    stream::unfold(receiver, |mut receiver| async move {
        let part = receiver.recv().await?;
        Some((part, receiver))
    })
    .boxed()
}

/// Standard input, whole (`binary`) or split at `delimiter`.
fn stdin_parts(binary: bool, delimiter: u8) -> Box<dyn Iterator<Item = io::Result<Vec<u8>>>> {
    let stdin = io::stdin().lock();
    if binary {
        let mut all = Vec::new();
        return Box::new(std::iter::once(
            io::Read::read_to_end(&mut { stdin }, &mut all).map(|_| all),
        ));
    }
    Box::new(io::BufRead::split(stdin, delimiter).map(move |part| {
        let mut part = part?;
        // A line of a file written on Windows ends in \r\n.
        if delimiter == b'\n' && part.last() == Some(&b'\r') {
            part.pop();
        }
        Ok(part)
    }))
}

/// One record of `broker publish`: where it was stored (an offset of -1 when its partition was
/// full), or the partition it was meant for (if known) and why the broker refused it alone.
type Placed = Result<(i32, i64), (Option<i32>, String)>;

/// A failed publish of one record: its refusal when the broker refused that record alone (too
/// large) and the others may go on, or the error that ends the command.
fn refused_or_fatal(partition: Option<i32>, error: Error) -> anyhow::Result<Placed> {
    match error {
        Error::Server(too_large @ broker_client::ErrorReply::TooLarge { .. }) => {
            Ok(Err((partition, too_large.to_string())))
        }
        other => Err(other.into()),
    }
}

/// Publishes one record of `broker publish`.
async fn publish_one(
    client: &Client,
    topic: &str,
    partition: Option<i32>,
    key: Option<&[u8]>,
    headers: &[Header],
    payload: Vec<u8>,
) -> anyhow::Result<Placed> {
    if !headers.is_empty() {
        // Headers travel only in a batch record.
        let record = match partition {
            Some(partition) => PublishRecord::to_partition(partition, payload),
            None => PublishRecord::keyed(key, payload),
        };
        return match client
            .publish_batch(topic, vec![record.with_headers(headers.to_vec())])
            .await
        {
            Ok(placed) => placed
                .first()
                .copied()
                .map(Ok)
                .context("the server placed no record"),
            Err(error) => refused_or_fatal(partition, error),
        };
    }
    let stored = match partition {
        Some(partition) => client
            .publish(topic, partition, payload)
            .await
            .map(|offset| (partition, offset)),
        None => client.publish_keyed(topic, key, payload).await,
    };
    match stored {
        Ok(placed) => Ok(Ok(placed)),
        Err(error) => refused_or_fatal(partition, error),
    }
}

/// The most payload, key and header bytes a partition of `topic` keeps, if it has such a limit.
async fn topic_max_bytes(client: &Client, topic: &str) -> anyhow::Result<Option<u64>> {
    let description = client.describe_topic(topic).await?;
    Ok(TopicSettings::from_list(&description.settings)?.max_bytes)
}

async fn publish(client: &Client, mut args: PublishArgs) -> anyhow::Result<()> {
    let payloads = payloads(&mut args);
    let topic = args.topic.as_str();
    let key = args.key.as_deref().map(str::as_bytes);
    let partition = args.partition;
    let headers = &args.headers;
    let mut results = payloads
        .map(|payload| async move {
            let payload = payload.context("cannot read standard input")?;
            let size = payload.len()
                + key.map_or(0, <[u8]>::len)
                + headers.iter().map(|header| header.size()).sum::<usize>();
            let placed = publish_one(client, topic, partition, key, headers, payload).await?;
            anyhow::Ok((placed, size))
        })
        .buffered(PUBLISH_PIPELINE);
    let (mut full, mut over_max_bytes, mut other) = (0u64, 0u64, 0u64);
    // The topic's byte limit, looked up at the first record refused as full.
    let mut max_bytes: Option<Option<u64>> = None;
    let mut stdout = io::stdout().lock();
    let mut record = 0u64;
    let mut stored = 0u64;
    loop {
        let next = match results.try_next().await {
            Ok(next) => next,
            // A lost connection (a cluster's failover, say) ends the command: say how far it
            // got, since every record answered before it is in the topic.
            // The cause first: it is what to act on.
            Err(error) => {
                // Refused by the server: it stored nothing of that record for sure.
                let refused = error.chain().any(|cause| {
                    cause
                        .downcast_ref::<broker_client::Error>()
                        .is_some_and(|error| {
                            !error.is_retriable() && !error.may_have_been_applied()
                        })
                });
                let progress = match (record, refused) {
                    (0, true) => format!(
                        "the first record was refused; the {} after it at most were on their \
                         way and may or may not be stored, and the rest of the input was not \
                         published",
                        PUBLISH_PIPELINE - 1
                    ),
                    _ => format!(
                        "{record} records were answered before this ({stored} stored); the \
                         next {PUBLISH_PIPELINE} at most were on their way and may or may not be \
                         stored, and the rest of the input was not published"
                    ),
                };
                return Err(anyhow!("{error:#} ({progress})"));
            }
        };
        let Some((result, size)) = next else { break };
        record += 1;
        let (partition, refused) = match result {
            Ok((partition, offset)) if offset >= 0 => {
                stored += 1;
                if args.quiet {
                    continue;
                }
                if args.json {
                    let json = serde_json::json!({
                        "record": record, "topic": topic, "partition": partition, "offset": offset,
                    });
                    writeln!(stdout, "{json}")?;
                } else {
                    writeln!(
                        stdout,
                        "published to {topic} partition {partition} offset {offset}"
                    )?;
                }
                continue;
            }
            Ok((partition, _)) => {
                if max_bytes.is_none() {
                    // Not known (the topic is gone, say): the record counts as full.
                    max_bytes = Some(topic_max_bytes(client, topic).await.ok().flatten());
                }
                match max_bytes.flatten().filter(|&max| size as u64 > max) {
                    Some(max) => {
                        over_max_bytes += 1;
                        (
                            Some(partition),
                            format!(
                                "its {size} bytes are more than a partition of {topic} keeps \
                                 (--max-bytes {max}): it can never be stored"
                            ),
                        )
                    }
                    None => {
                        full += 1;
                        (
                            Some(partition),
                            format!("partition {partition} of {topic} is full"),
                        )
                    }
                }
            }
            Err((partition, why)) => {
                other += 1;
                (partition, why)
            }
        };
        if !args.quiet {
            eprintln!("record {record} not stored: {refused}");
        }
        if args.json {
            let json = serde_json::json!({
                "record": record, "topic": topic, "partition": partition, "offset": null,
                "error": refused,
            });
            writeln!(stdout, "{json}")?;
        }
    }
    if full + over_max_bytes + other > 0 {
        let mut why = Vec::new();
        if full > 0 {
            why.push(format!(
                "{full} because their partition was full: it holds the most the topic allows \
                 (its --max-records or --max-bytes, or the server's --capacity), or the \
                 server's records fill its --max-memory; see `broker \
                 describe {topic}` (with interest retention, records leave once every group has \
                 consumed them; with limits retention, by its limits, --max-age or `broker \
                 purge`)"
            ));
        }
        if over_max_bytes > 0 {
            why.push(format!(
                "{over_max_bytes} because they are larger than the topic's --max-bytes"
            ));
        }
        if other > 0 {
            why.push(format!(
                "{other} because the server refused them (each one's reason is above)"
            ));
        }
        bail!(
            "{} of {record} records were not stored: {}",
            full + over_max_bytes + other,
            why.join("; ")
        );
    }
    if args.quiet {
        writeln!(
            stdout,
            "published {record} record{} to {topic}",
            if record == 1 { "" } else { "s" }
        )?;
    }
    Ok(())
}

async fn join(client: &Client, args: JoinArgs) -> anyhow::Result<()> {
    let MemberArgs {
        topic,
        group,
        member,
    } = &args.member;
    let partitions = join_member(client, &args.member, args.assignor, &[]).await?;
    outln!("{member} joined group {group} on {topic}: partitions {partitions:?}")?;
    Ok(())
}

/// Joins the member to its group, with the assignor and the settings of a new group if any
/// were named.
async fn join_member(
    client: &Client,
    member: &MemberArgs,
    assignor: Option<AssignorArg>,
    settings: &[GroupSetting],
) -> Result<Vec<i32>, Error> {
    let MemberArgs {
        topic,
        group,
        member,
    } = member;
    client
        .join_group(topic, group, member, assignor.map(Assignor::from), settings)
        .await
}

async fn leave(client: &Client, args: MemberArgs) -> anyhow::Result<()> {
    let MemberArgs {
        topic,
        group,
        member,
    } = &args;
    if client.leave(topic, group, member).await? {
        outln!("{member} left group {group} on {topic}")?;
    } else {
        outln!("{member} is not a member of group {group} on {topic} (nothing changed)")?;
    }
    Ok(())
}

async fn consume(client: &Client, args: ConsumeArgs) -> anyhow::Result<()> {
    let MemberArgs {
        topic,
        group,
        member,
    } = &args.member;
    if args.retry_after.is_some() && args.mode != ConsumeMode::Ack {
        return usage(
            "consume",
            "--retry-after is for ack mode: fetch mode has no deliveries to retry",
        );
    }
    if args.mode != ConsumeMode::Ack
        && (args.ack_timeout.is_some() || args.dead_letters.given().is_some())
    {
        return usage(
            "consume",
            "--ack-timeout, --max-deliveries and --dead-letter are for ack mode: they govern \
             deliveries, which fetch mode does not have",
        );
    }
    if args.retry_after.is_some() && args.count.is_none() && !args.follow {
        return usage(
            "consume",
            "--retry-after needs --count or --follow: retried records come back",
        );
    }
    if args.mode == ConsumeMode::Ack && args.batch > MAX_POLL_RECORDS {
        return usage(
            "consume",
            format!(
                "--batch in ack mode is at most {MAX_POLL_RECORDS} (a poll takes one record per \
                 partition)"
            ),
        );
    }
    let mut settings = Vec::new();
    if let Some(start_at) = args.start_at {
        settings.push(GroupSetting::StartAt(start_at.into()));
    }
    if let Some(timeout) = args.ack_timeout {
        settings.push(GroupSetting::AckTimeoutMs(millis(timeout)));
    }
    if let Some((max, topic)) = args.dead_letters.given() {
        settings.push(GroupSetting::MaxDeliveries(max));
        settings.push(GroupSetting::DeadLetter(topic));
    }
    let mut builder = Consumer::builder(topic.as_str(), group.as_str())
        .member(member.as_str())
        .mode(match args.mode {
            ConsumeMode::Ack => broker_client::ConsumeMode::Ack,
            ConsumeMode::Fetch => broker_client::ConsumeMode::Fetch,
        })
        .max_records(args.count.map_or(args.batch, |count| {
            i32::try_from(count).map_or(args.batch, |count| args.batch.min(count))
        }))
        .max_wait(if args.follow {
            FOLLOW_WAIT
        } else {
            Duration::ZERO
        })
        // Each batch is committed once printed.
        .auto_commit(None)
        .group_settings(settings);
    if let Some(assignor) = args.assignor {
        builder = builder.assignor(assignor.into());
    }
    let mut consumer = builder.start(client.clone()).await?;
    let mut status = consumer.status();
    let partitions = status.borrow_and_update().assignment.clone();
    eprintln!("{member} joined group {group} on {topic}: partitions {partitions:?}");
    let replay = if args.from_beginning {
        Some(ResetTo::Earliest)
    } else if args.from_latest {
        Some(ResetTo::Latest)
    } else {
        args.from_datetime.map(ResetTo::Timestamp)
    };
    if let Some(to) = replay {
        let rows = client.reset_group(topic, group, None, to).await?;
        let from: Vec<String> = rows
            .iter()
            .map(|row| format!("{}@{}", row.partition, row.committed))
            .collect();
        eprintln!("group {group} reset to {}", from.join(" "));
    }
    let reporter = tokio::spawn(report_status(status.clone(), args.follow));
    let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut consumed = 0u64;
    let stopped = tokio::select! {
        result = consume_loop(&mut consumer, &args, &mut consumed) => result.map(|()| None),
        // Only --follow waits for the server to come back (or for its storage to be mended).
        why = first_failure(status), if !args.follow => Err(anyhow!(
            "cannot consume ({why}) for {} s; without --follow, consuming stops here",
            LOST_GRACE.as_secs()
        )),
        _ = tokio::signal::ctrl_c() => Ok(Some(Interrupted::SIGINT)),
        _ = terminate.recv() => Ok(Some(Interrupted::SIGTERM)),
    };
    reporter.abort();
    // Whatever happened, hand the partitions back so the others take over at once. Each batch
    // was committed (fetch mode) or acknowledged (ack mode) right after it was printed, so
    // what an interruption cut short is delivered again: at least once, never lost.
    let closed = if args.stay {
        consumer.close_and_stay().await
    } else {
        consumer.close().await
    };
    let stopped = stopped?;
    if let Some(signal) = stopped {
        eprintln!("{}", signal.what);
    }
    eprintln!(
        "consumed {consumed} record{}",
        if consumed == 1 { "" } else { "s" }
    );
    closed?;
    match stopped {
        Some(signal) => Err(signal.into()),
        None => Ok(()),
    }
}

/// Arguments that clap takes one by one but that do not go together (`--batch 65` in ack
/// mode, `--retry-after` in fetch mode, ...): exits with 2, as clap's own refusals do.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Usage {
    /// The subcommand whose arguments they are.
    pub command: &'static str,
    /// What is wrong, and what to give instead.
    pub message: String,
}

/// Refuses the arguments of `command` with `message` (see [`Usage`]).
fn usage<T>(command: &'static str, message: impl Into<String>) -> anyhow::Result<T> {
    Err(Usage {
        command,
        message: message.into(),
    }
    .into())
}

/// `broker consume` was stopped by a signal: it exits with 128 plus the signal's number, as a
/// shell reports a process the signal ended.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("{what}")]
pub struct Interrupted {
    what: &'static str,
    /// The exit code.
    pub code: u8,
}

impl Interrupted {
    const SIGINT: Interrupted = Interrupted {
        what: "interrupted",
        code: 130,
    };
    const SIGTERM: Interrupted = Interrupted {
        what: "terminated",
        code: 143,
    };
}

/// How long `broker consume` without --follow waits for a lost server to come back before it
/// gives up: a cluster elects a new leader in about 2 seconds.
const LOST_GRACE: Duration = Duration::from_secs(5);

/// Why the consumer lost the server, once it has been lost for [`LOST_GRACE`]: waits until then.
async fn first_failure(mut status: watch::Receiver<ConsumerStatus>) -> String {
    loop {
        let lost = status.borrow_and_update().reconnecting.clone();
        let Some(why) = lost else {
            if status.changed().await.is_err() {
                // The consumer is gone: the consume loop ends by itself.
                return std::future::pending().await;
            }
            continue;
        };
        let back = tokio::time::timeout(LOST_GRACE, async {
            while status.changed().await.is_ok() {
                if status.borrow_and_update().reconnecting.is_none() {
                    return true;
                }
            }
            false
        });
        match back.await {
            Ok(true) => {}
            Ok(false) => return std::future::pending().await,
            Err(_) => return why,
        }
    }
}

/// Tells on standard error when the consumer's partitions change and, when it waits for a lost
/// server (`follow`), when it loses and finds the server again.
async fn report_status(mut status: watch::Receiver<ConsumerStatus>, follow: bool) {
    let mut shown = status.borrow_and_update().clone();
    while status.changed().await.is_ok() {
        let now = status.borrow_and_update().clone();
        match (&shown.reconnecting, &now.reconnecting) {
            (None, Some(why)) if follow => eprintln!("cannot consume ({why}); trying again"),
            (Some(_), None) if follow => eprintln!("consuming again"),
            _ => {}
        }
        if now.reconnecting.is_none() && now.assignment != shown.assignment {
            eprintln!("partitions now {:?}", now.assignment);
        }
        shown = now;
    }
}

/// Consumes until nothing is left (or `--count` is reached; with `--follow`, until
/// interrupted), counting the records printed in `consumed`.
async fn consume_loop(
    consumer: &mut Consumer,
    args: &ConsumeArgs,
    consumed: &mut u64,
) -> anyhow::Result<()> {
    loop {
        let remaining = args.count.map_or(u64::MAX, |count| count - *consumed);
        if remaining == 0 {
            return Ok(());
        }
        // No more than --count still allows: a record taken and not printed would be delivered
        // again (in ack mode, one more delivery towards the group's --max-deliveries).
        let wanted = i32::try_from(remaining).map_or(args.batch, |left| args.batch.min(left));
        consumer.set_max_records(wanted)?;
        let mut deliveries = consumer.next_batch().await?;
        if deliveries.is_empty() && !args.follow {
            return Ok(());
        }
        // A batch may hold more than --count still allows: the rest is not printed, and comes
        // again (ack mode: never acknowledged; fetch mode: committed only up to it).
        deliveries.truncate(usize::try_from(remaining).unwrap_or(usize::MAX));
        let printed = print_records(&deliveries, RecordFormat::of(args))?;
        *consumed += printed as u64;
        match args.mode {
            ConsumeMode::Ack => match args.retry_after {
                Some(delay) => retry(&deliveries[..printed], delay).await?,
                None => acknowledge(&deliveries[..printed]).await?,
            },
            ConsumeMode::Fetch => {
                let mut offsets = BTreeMap::new();
                for delivery in &deliveries[..printed] {
                    offsets.insert(delivery.partition, delivery.offset + 1);
                }
                if let Some(first_unprinted) = deliveries.get(printed) {
                    offsets
                        .entry(first_unprinted.partition)
                        .or_insert(first_unprinted.offset);
                }
                if !offsets.is_empty() {
                    match consumer.commit_offsets(offsets).await {
                        // The commit may or may not have been applied. If the consumer then
                        // loses the server, it joins again from the group's committed offsets
                        // and what this commit covered comes again; if not, the next commit
                        // covers it.
                        Err(error) if args.follow && error.is_retriable() => eprintln!(
                            "could not commit ({error}): the records printed since the last \
                             commit may be delivered again"
                        ),
                        committed => committed?,
                    }
                }
            }
        }
        if printed < deliveries.len() {
            // Standard output was closed (`broker consume ... | head`): done, not an error.
            return Ok(());
        }
    }
}

/// How `broker consume` prints a record.
#[derive(Debug, Clone, Copy)]
enum RecordFormat {
    /// One line of text.
    Text,
    /// One JSON object a line.
    Json,
    /// The payload's bytes, then this byte.
    Raw(u8),
}

impl RecordFormat {
    fn of(args: &ConsumeArgs) -> RecordFormat {
        match (args.json, args.raw) {
            (true, _) => RecordFormat::Json,
            (false, true) => RecordFormat::Raw(args.delimiter.unwrap_or(b'\n')),
            (false, false) => RecordFormat::Text,
        }
    }

    /// Writes `record` to `out`.
    fn write(self, out: &mut impl Write, record: &BrokerRecord) -> io::Result<()> {
        match self {
            RecordFormat::Text => writeln!(out, "{}", output::record_line(record)),
            RecordFormat::Json => writeln!(out, "{}", output::record_json(record)),
            RecordFormat::Raw(delimiter) => {
                out.write_all(&record.payload)?;
                out.write_all(&[delimiter])
            }
        }
    }
}

/// Prints records, one after another; returns how many were printed before standard output
/// was closed by its reader (all of them unless a pipe like `| head` closed early).
fn print_records(records: &[Delivery], format: RecordFormat) -> io::Result<usize> {
    let mut stdout = io::stdout().lock();
    for (printed, record) in records.iter().enumerate() {
        match format
            .write(&mut stdout, record)
            .and_then(|()| stdout.flush())
        {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::BrokenPipe => return Ok(printed),
            Err(error) => return Err(error),
        }
    }
    Ok(records.len())
}

/// Retries each of `deliveries`, to be delivered again no earlier than `delay`.
async fn retry(deliveries: &[Delivery], delay: Duration) -> anyhow::Result<()> {
    let retries = deliveries.iter().map(|delivery| async move {
        if delay.is_zero() {
            delivery.retry().await
        } else {
            delivery.retry_after(delay).await
        }
    });
    futures::future::try_join_all(retries).await?;
    Ok(())
}

async fn acknowledge(deliveries: &[Delivery]) -> anyhow::Result<()> {
    let acks = deliveries.iter().map(Delivery::ack);
    for (delivery, acked) in deliveries
        .iter()
        .zip(futures::future::try_join_all(acks).await?)
    {
        if !acked {
            // The partition moved to another member in a rebalance, or the server was lost
            // (the acknowledgement may then have been applied, its answer lost).
            eprintln!(
                "partition {} offset {} was not acknowledged (the partition moved, or the \
                 server was lost): it may be delivered again",
                delivery.partition, delivery.offset
            );
        }
    }
    Ok(())
}

async fn describe(client: &Client, args: DescribeArgs) -> anyhow::Result<()> {
    let description = match &args.topic {
        Some(topic) => broker_client::BrokerDescription {
            capacity_per_partition: client.describe().await?.capacity_per_partition,
            topics: vec![client.describe_topic(topic).await?],
        },
        None => client.describe().await?,
    };
    let kafka = crate::kafka_groups::kafka_groups(client)
        .await
        .unwrap_or_else(|error| {
            eprintln!("warning: the members of Kafka's consumer groups are not shown: {error}");
            Vec::new()
        });
    // Described for one topic: the Kafka groups of that topic alone (its groups' names, or
    // members assigned its partitions).
    let kafka: Vec<_> = kafka
        .into_iter()
        .filter(|group| {
            args.topic.is_none()
                || description.topics.iter().any(|topic| {
                    topic.groups.iter().any(|held| held.name == group.name)
                        || group.members.iter().any(|member| {
                            member
                                .assignment
                                .iter()
                                .any(|assigned| assigned.topic == topic.name)
                        })
                })
        })
        .collect();
    if args.json {
        /// The description with Kafka's groups after its own fields, in their order.
        #[derive(serde::Serialize)]
        struct WithKafkaGroups<'a> {
            #[serde(flatten)]
            description: &'a broker_client::BrokerDescription,
            kafka_groups: &'a [KafkaGroupDescription],
        }
        // Only where Kafka's clients joined groups: the text stays as it was otherwise.
        let json = match kafka.is_empty() {
            true => serde_json::to_string_pretty(&description)?,
            false => serde_json::to_string_pretty(&WithKafkaGroups {
                description: &description,
                kafka_groups: &kafka,
            })?,
        };
        outln!("{json}")?;
    } else {
        print!("{}", output::description_text(&description, &kafka));
    }
    Ok(())
}

/// The error for `group`, which `topic` does not have, naming the groups it has.
fn unknown_group(topic: &str, group: &str, known: &[GroupDescription]) -> anyhow::Error {
    let names: Vec<&str> = known.iter().map(|group| group.name.as_str()).collect();
    anyhow::anyhow!(
        "group {group} does not exist on topic {topic} ({})",
        match names.is_empty() {
            true => "it has no groups".to_owned(),
            false => format!("its groups: {}", names.join(", ")),
        }
    )
}

async fn lag(client: &Client, args: LagArgs) -> anyhow::Result<()> {
    let known = client.describe_topic(&args.topic).await?.groups;
    if !known.iter().any(|group| group.name == args.group) {
        // A consumer group of Kafka's clients is held by the broker once it commits.
        let kafka = crate::kafka_groups::kafka_groups(client)
            .await
            .unwrap_or_default();
        let consumes = |group: &KafkaGroupDescription| {
            let rebalancing = !group.members.is_empty() && group.state != "Stable";
            rebalancing
                || group.members.iter().any(|member| {
                    member
                        .assignment
                        .iter()
                        .any(|assigned| assigned.topic == args.topic)
                })
        };
        if kafka
            .iter()
            .any(|group| group.name == args.group && consumes(group))
        {
            anyhow::bail!(
                "group {} is a consumer group of Kafka's clients that has committed no offset \
                 on topic {} yet: its lag shows once it commits",
                args.group,
                args.topic
            );
        }
        return Err(unknown_group(&args.topic, &args.group, &known));
    }
    let lag = client.lag(&args.topic, &args.group).await?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&lag)?)?;
    } else {
        print!("{}", output::lag_text(&args.topic, &args.group, &lag));
    }
    Ok(())
}

fn size_command(args: &SizeArgs) -> anyhow::Result<()> {
    let sizing = size::size(size::SizingInput {
        message_bytes: args.message_bytes,
        messages_per_second: args.rate,
        retention: args.retention,
        replication: args.replication,
        headroom_percent: args.headroom,
    })?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&sizing)?)?;
        return Ok(());
    }
    let line = |label: &str, bytes: u64| {
        outln!(
            "{label:<28} {:>26} bytes  {}",
            size::with_thousands(bytes),
            size::human(bytes)
        )
    };
    line("written per second:", sizing.bytes_per_second)?;
    line(
        &format!(
            "one copy, {}:",
            broker_client::duration_text(millis(args.retention))
        ),
        sizing.one_copy_bytes,
    )?;
    let replicas = format!(
        "{} replica{}",
        args.replication,
        output::plural(args.replication)
    );
    line(&format!("x {replicas}:"), sizing.replicated_bytes)?;
    line(
        &format!("with {}% headroom:", args.headroom),
        sizing.with_headroom_bytes,
    )?;
    outln!(
        "\non this broker's disk: {} records of {} bytes + {} bytes of segment and index each",
        size::with_thousands(sizing.records),
        args.message_bytes,
        sizing.overhead_bytes_per_record
    )?;
    line("one copy on disk:", sizing.on_disk_bytes)?;
    line(
        &format!("x {replicas} + {}% headroom:", args.headroom),
        sizing.on_disk_with_headroom_bytes,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_time_further_ago_than_the_epoch_is_the_epoch() {
        assert_eq!(
            ago_ms(Duration::from_secs(100 * 365 * 24 * 3600)).unwrap(),
            0
        );
        // 2020-01-01: no clock this runs on is earlier.
        assert!(ago_ms(Duration::ZERO).unwrap() > 1_577_836_800_000);
    }
}
