//! `broker cluster`: what each node of a cluster knows of it, and adding and removing nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{anyhow, bail};
use broker_client::{
    BrokerError, Client, ClusterMember, ClusterStatus, Error, ErrorReply, GroupSetting,
    GroupStatus, NodeRole,
};
use futures::future::join_all;

use crate::cli::{
    AddNodeArgs, BalanceArgs, BalanceBy, ClusterStatusArgs, ClusterTopicsArgs, MoveArgs,
    RemoveNodeArgs, TransferArgs,
};
use crate::connect::Server;
use crate::output::plural;

/// How long `broker cluster status` waits for each node: one that is down must not hold up the
/// others' rows for long.
const NODE_TIMEOUT: Duration = Duration::from_secs(3);

/// How long `broker cluster add` waits for its answer before it says what it is waiting for.
const SLOW_ANSWER: Duration = Duration::from_millis(500);

/// One member's row: the membership entry (as the leader, else the first node that answered,
/// describes it) and what the member itself said, or why it did not.
struct Row {
    member: ClusterMember,
    own: Result<ClusterStatus, String>,
}

/// `broker cluster status`: the first node of --addr that knows a leader (else the first that
/// answers), and that leader, tell the members; each member is then asked about itself, and
/// each that answered, about the groups it hosts. Every node is asked at once and once at most
/// each time, so a node that does not answer costs the command [`NODE_TIMEOUT`] in all.
pub async fn status(server: &Server, args: ClusterStatusArgs) -> anyhow::Result<()> {
    let given: Vec<&str> = server.addr.split(',').map(str::trim).collect();
    let asked: Vec<(String, Result<ClusterStatus, String>)> = join_all(
        given
            .iter()
            .map(|addr| async move { (addr.to_string(), ask(server, addr).await) }),
    )
    .await;
    let mut failures = Vec::new();
    let mut first: Option<ClusterStatus> = None;
    for (addr, answer) in &asked {
        match answer {
            // A node that knows no leader may be cut off, removed, or waiting to join: another
            // node may know better.
            Ok(status) if status.leader.is_some() && !status.members.is_empty() => {
                first = Some(status.clone());
                break;
            }
            Ok(status) => {
                first.get_or_insert_with(|| status.clone());
            }
            Err(why) => failures.push(format!("{addr}: {why}")),
        }
    }
    // What a node already said (or why it did not), by its client address.
    let answered = |addr: &str| {
        asked
            .iter()
            .find(|(asked, _)| asked == addr)
            .map(|(_, answer)| answer.clone())
    };
    let Some(first) = first else {
        let why = format!("cannot show the cluster: {}", failures.join("; "));
        if args.json {
            outln!("{}", serde_json::json!({ "error": why }))?;
        }
        bail!(why);
    };
    if first.members.is_empty() {
        let why = format!(
            "node {} is not a member of a cluster yet: it waits to be added (`broker cluster add` \
             with its ID=PEER_ADDR/CLIENT_ADDR, against a node of the cluster)",
            first.node_id
        );
        if args.json {
            outln!("{}", serde_json::json!({ "error": why }))?;
        }
        bail!(why);
    }
    // The leader's view says how far each member has the log. The node named must still say it
    // leads: one handing its leadership over, or cut off, no longer does.
    let leader = match first.leader {
        Some(leader) if leader == first.node_id => Some(first.clone()),
        Some(leader) => match first.members.iter().find(|m| m.node_id == leader) {
            Some(member) => match answered(&member.client_addr) {
                Some(answer) => answer.ok(),
                None => ask(server, &member.client_addr).await.ok(),
            },
            None => None,
        },
        None => None,
    }
    .filter(leads);
    let view = leader.as_ref().unwrap_or(&first);
    let answers = join_all(view.members.iter().map(|member| async {
        let known = [Some(&first), leader.as_ref()]
            .into_iter()
            .flatten()
            .find(|status| status.node_id == member.node_id);
        match (known, answered(&member.client_addr)) {
            (Some(status), _) => Ok(status.clone()),
            (None, Some(answer)) => answer,
            (None, None) => ask(server, &member.client_addr).await,
        }
    }))
    .await;
    let rows: Vec<Row> = view
        .members
        .iter()
        .cloned()
        .zip(answers)
        .map(|(member, own)| Row { member, own })
        .collect();
    let leader_last = leader.as_ref().and_then(|status| status.last_log_index);
    // Only the nodes that answered: one that did not costs the command one wait, not two.
    let addrs: Vec<&str> = rows
        .iter()
        .filter(|row| row.own.is_ok())
        .map(|row| row.member.client_addr.as_str())
        .collect();
    let groups = groups(server, &addrs).await;
    if args.json {
        let nodes: Vec<_> = rows
            .iter()
            .map(|row| {
                serde_json::json!({
                    "node_id": row.member.node_id,
                    "peer_addr": row.member.peer_addr,
                    "client_addr": row.member.client_addr,
                    "voter": row.member.voter,
                    "behind": behind(leader_last, &row.member),
                    "status": row.own.as_ref().ok(),
                    "error": row.own.as_ref().err(),
                })
            })
            .collect();
        let groups: Vec<_> = groups
            .iter()
            .map(|group| {
                serde_json::json!({
                    "group": group.group,
                    "leader": group.leader,
                    "term": group.term,
                    "last_log_index": group.last_log_index,
                    "behind": group.behind.iter().map(|(node, behind)| {
                        serde_json::json!({ "node_id": node, "behind": behind })
                    }).collect::<Vec<_>>(),
                    "voters": group.voters,
                    "topics": group.topics,
                })
            })
            .collect();
        let json = serde_json::json!({
            "leader": leader.as_ref().map(|status| status.node_id),
            "term": leader.as_ref().map(|status| status.term),
            "nodes": nodes,
            "groups": groups,
        });
        outln!("{}", serde_json::to_string_pretty(&json)?)?;
        return Ok(());
    }
    // With several groups, the table (roles, terms, logs) is of the first group.
    let of_first = match groups.len() > 1 {
        true => "first group's ",
        false => "",
    };
    match &leader {
        Some(status) => outln!(
            "{of_first}leader: node {} in term {}; {} voters, {} learners",
            status.node_id,
            status.term,
            rows.iter().filter(|row| row.member.voter).count(),
            rows.iter().filter(|row| !row.member.voter).count()
        )?,
        None => match first.leader.filter(|named| *named != first.node_id) {
            Some(named) => outln!(
                "no leader confirmed: node {} names node {named}, which does not lead now or \
                 does not answer (a hand-over or an election may be under way)",
                first.node_id
            )?,
            None => outln!(
                "no leader known to node {} (an election may be under way, or a majority is \
                 down)",
                first.node_id
            )?,
        },
    }
    outln!(
        "{:<6} {:<11} {:>6} {:>10} {:>10} {:>8}  {:<5}  {:<22} {}",
        "node",
        "role",
        "term",
        "last log",
        "applied",
        "behind",
        "voter",
        "peer address",
        "client address"
    )?;
    for row in &rows {
        let member = &row.member;
        let voter = if member.voter { "yes" } else { "no" };
        let behind = behind(leader_last, member).map_or_else(|| "?".to_owned(), |n| n.to_string());
        match &row.own {
            Ok(own) => outln!(
                "{:<6} {:<11} {:>6} {:>10} {:>10} {:>8}  {:<5}  {:<22} {}",
                member.node_id,
                role_name(own.role),
                own.term,
                index(own.last_log_index),
                index(own.applied_index),
                behind,
                voter,
                member.peer_addr,
                member.client_addr
            )?,
            Err(why) => outln!(
                "{:<6} {:<11} {:>6} {:>10} {:>10} {:>8}  {:<5}  {:<22} {}  ({why})",
                member.node_id,
                "unreachable",
                "-",
                "-",
                "-",
                behind,
                voter,
                member.peer_addr,
                member.client_addr
            )?,
        }
    }
    // A cluster of one group has nothing more to show.
    if groups.len() > 1 {
        outln!()?;
        outln!(
            "{} groups; each row as its leader tells (\"none\" while the group elects or hands \
             its leadership over: ask again in a moment)",
            groups.len()
        )?;
        let behind_header = "behind (node: entries)";
        let behinds: Vec<String> = groups
            .iter()
            .map(|group| {
                let behind: Vec<String> = group
                    .behind
                    .iter()
                    .map(|(node, behind)| {
                        let behind = behind.map_or_else(|| "?".to_owned(), |n| n.to_string());
                        format!("{node}: {behind}")
                    })
                    .collect();
                behind.join(", ")
            })
            .collect();
        // As wide as the widest row, so that the topics line up however many members a
        // group has.
        let width = behinds
            .iter()
            .map(String::len)
            .chain([behind_header.len()])
            .max()
            .unwrap_or_default();
        outln!(
            "{:<6} {:<8} {:>6} {:>10}  {behind_header:<width$} topics",
            "group",
            "leader",
            "term",
            "last log",
        )?;
        for (group, behind) in groups.iter().zip(&behinds) {
            let topics = match group.topics.len() {
                0 => "-".to_owned(),
                _ => group.topics.join(", "),
            };
            outln!(
                "{:<6} {:<8} {:>6} {:>10}  {behind:<width$} {topics}",
                group.group,
                group
                    .leader
                    .map_or_else(|| "none".to_owned(), |id| id.to_string()),
                group.term,
                index(group.last_log_index),
            )?;
        }
        for line in catching_up(&groups) {
            outln!("{line}")?;
        }
    }
    Ok(())
}

/// A line for each node that is a learner of some of the other `groups` (as each group's row
/// tells): it is being added to them, and catches up with their logs before it votes. (A node
/// that votes in the first group but in no other group may hold no copy of them by design,
/// with fewer replicas than nodes, so it is not named; one started with fewer groups than the
/// cluster has says so in its log, and `broker cluster add` names the groups that lag.)
fn catching_up(groups: &[GroupRow]) -> Vec<String> {
    let mut learning: std::collections::BTreeMap<u64, Vec<String>> = Default::default();
    for group in groups
        .iter()
        .filter(|group| group.group > 1 && group.leader.is_some())
    {
        for (node, _) in &group.behind {
            if !group.voters.contains(node) {
                learning
                    .entry(*node)
                    .or_default()
                    .push(group.group.to_string());
            }
        }
    }
    learning
        .into_iter()
        .filter_map(|(node, lacking)| {
            let (last, others) = lacking.split_last()?;
            let which = match others {
                [] => format!("group {last}"),
                _ => format!("groups {} and {last}", others.join(", ")),
            };
            Some(format!(
                "node {node} is being added to {which}: it catches up with the group's log as a \
                 learner first, then votes"
            ))
        })
        .collect()
}

/// One Raft group's row of `broker cluster status`, as its leader tells it (else the first
/// node that answered about it).
struct GroupRow {
    group: u32,
    /// The node that leads it and says so.
    leader: Option<u64>,
    term: u64,
    last_log_index: Option<u64>,
    /// Each member with how many entries of the leader's log it lacks, as the leader knows.
    behind: Vec<(u64, Option<u64>)>,
    /// The members that vote in it.
    voters: Vec<u64>,
    topics: Vec<String>,
}

impl GroupRow {
    /// Whether node `node` is a member of the group.
    fn lists(&self, node: u64) -> bool {
        self.behind.iter().any(|(member, _)| *member == node)
    }
}

/// Each group of the cluster by ascending id, from what the nodes at `addrs` say of the groups
/// they hold a copy of (asked at once; a node that is down, or of a release before groups,
/// says nothing).
async fn groups(server: &Server, addrs: &[&str]) -> Vec<GroupRow> {
    let answers = join_all(addrs.iter().map(|addr| async move {
        let client = server
            .builder()
            .connect_timeout(NODE_TIMEOUT)
            .request_timeout(NODE_TIMEOUT)
            .connect(*addr)
            .await
            .ok()?;
        client.groups_status().await.ok()
    }))
    .await;
    let mut by_group: std::collections::BTreeMap<u32, Vec<GroupStatus>> = Default::default();
    for group in answers.into_iter().flatten().flatten() {
        by_group.entry(group.group).or_default().push(group);
    }
    by_group
        .into_values()
        .map(|mut views| {
            let at = views
                .iter()
                .position(|view| leads(&view.status))
                .unwrap_or(0);
            let view = views.swap_remove(at);
            let leads = leads(&view.status);
            let last = view.status.last_log_index.filter(|_| leads);
            GroupRow {
                group: view.group,
                leader: leads.then_some(view.status.node_id),
                term: view.status.term,
                last_log_index: view.status.last_log_index,
                behind: view
                    .status
                    .members
                    .iter()
                    .map(|member| (member.node_id, behind(last, member)))
                    .collect(),
                voters: view
                    .status
                    .members
                    .iter()
                    .filter(|member| member.voter)
                    .map(|member| member.node_id)
                    .collect(),
                topics: view.topics,
            }
        })
        .collect()
}

/// `broker cluster topics`: the metadata of the node asked (each topic's leader), with each
/// topic's group from the groups the nodes hold copies of.
pub async fn topics(server: &Server, args: ClusterTopicsArgs) -> anyhow::Result<()> {
    let client = server.connect().await?;
    let metadata = client.metadata(args.topic.as_deref()).await?;
    if metadata.nodes.is_empty() {
        bail!("this server runs alone, not as a node of a cluster: it serves every topic itself");
    }
    // Every node is asked: one holds copies of some groups only (`--cluster-replicas`). A
    // cluster of one group (or nodes of a release before groups) names no group.
    let addrs: Vec<&str> = metadata
        .nodes
        .iter()
        .map(|node| node.client_addr.as_str())
        .collect();
    let rows = groups(server, &addrs).await;
    let groups: std::collections::BTreeMap<String, u32> = match rows.len() > 1 {
        true => rows
            .into_iter()
            .flat_map(|row| row.topics.into_iter().map(move |topic| (topic, row.group)))
            .collect(),
        false => Default::default(),
    };
    if args.json {
        let topics: Vec<_> = metadata
            .topics
            .iter()
            .map(|topic| {
                serde_json::json!({
                    "topic": topic.topic,
                    "partitions": topic.partition_count,
                    "leader": topic.leader,
                    "group": groups.get(&topic.topic),
                })
            })
            .collect();
        let json = serde_json::json!({ "nodes": metadata.nodes, "topics": topics });
        outln!("{}", serde_json::to_string_pretty(&json)?)?;
        return Ok(());
    }
    let address = |id: u64| {
        metadata
            .nodes
            .iter()
            .find(|node| node.node_id == id)
            .map_or("?", |node| node.client_addr.as_str())
    };
    if metadata.topics.is_empty() {
        outln!("no topics")?;
        return Ok(());
    }
    outln!(
        "{:<32} {:>10}  {:<6} leader",
        "topic",
        "partitions",
        "group"
    )?;
    for topic in &metadata.topics {
        let group = groups
            .get(&topic.topic)
            .map_or_else(|| "-".to_owned(), u32::to_string);
        let leader = topic.leader.map_or_else(
            || "none (its group elects: ask again in a moment)".to_owned(),
            |id| format!("node {id} at {}", address(id)),
        );
        outln!(
            "{:<32} {:>10}  {:<6} {leader}",
            topic.topic,
            topic.partition_count,
            group
        )?;
    }
    Ok(())
}

/// A membership change made in part: the server stopped waiting for some of its steps, which
/// go on (exit status 3).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Pending(String);

impl Pending {
    /// The exit status of a command whose change is pending.
    pub const EXIT_STATUS: u8 = 3;
}

/// `result`, with a pending change as a [`Pending`] error.
fn pending_apart<T>(result: Result<T, Error>) -> anyhow::Result<T> {
    match result {
        Err(Error::Server(ErrorReply::Pending(what))) => Err(Pending(what).into()),
        other => Ok(other?),
    }
}

/// `broker cluster add`.
pub async fn add(server: &Server, args: AddNodeArgs) -> anyhow::Result<()> {
    let client = server.connect().await?;
    let node = args.node;
    let already = leader_view(server, &client).await.is_some_and(|status| {
        status.members.iter().any(|member| {
            member.node_id == node.node_id
                && member.voter
                && member.peer_addr == node.peer_addr
                && member.client_addr == node.client_addr
        })
    });
    // Asked again after an add that timed out, it waits for the groups that are to take the
    // node and lack it (the server knows which: with fewer replicas than nodes, not all).
    if already {
        pending_apart(
            client
                .add_node(node.node_id, &node.peer_addr, &node.client_addr)
                .await,
        )?;
        outln!(
            "node {} is a voter of the cluster already, at these addresses (and of every group \
             that is to hold a copy on it): nothing to do",
            node.node_id
        )?;
        return Ok(());
    }
    let adding = client.add_node(node.node_id, &node.peer_addr, &node.client_addr);
    tokio::pin!(adding);
    // Said only when the answer is slow in coming: a refusal (addresses another node has, say)
    // comes at once, and the wait does not apply to it.
    let members = tokio::select! {
        added = &mut adding => pending_apart(added)?,
        () = tokio::time::sleep(SLOW_ANSWER) => {
            eprintln!(
                "adding node {}: it catches up with the leader's log, then votes (the leader \
                 waits up to 20 s for it)",
                node.node_id
            );
            pending_apart(adding.await)?
        }
    };
    outln!(
        "node {} added; the cluster's voters: {}",
        node.node_id,
        voters(&members)
    )?;
    Ok(())
}

/// `broker cluster remove`.
pub async fn remove(server: &Server, args: RemoveNodeArgs) -> anyhow::Result<()> {
    let client = server.connect().await?;
    let node = args.node_id;
    let view = leader_view(server, &client).await;
    let mut only_groups = false;
    let member = match &view {
        Some(status) => match status.members.iter().find(|member| member.node_id == node) {
            Some(member) => Some(member),
            // Asked again after a remove that timed out, it waits for the groups that still
            // list the node.
            None if any_group(server, &client, |row| row.lists(node)).await => {
                eprintln!(
                    "node {node} has left the first group; waiting for the data groups that \
                     still list it to remove it"
                );
                only_groups = true;
                None
            }
            None => {
                outln!(
                    "node {node} is not a member of the cluster: nothing to do; the cluster's \
                     voters: {}",
                    voters(&status.members)
                )?;
                return Ok(());
            }
        },
        None => None,
    };
    let leads = view.as_ref().and_then(|status| status.leader) == Some(node);
    match member {
        _ if only_groups => {}
        Some(member) if !member.voter => {
            eprintln!("removing node {node}, a learner: it leaves the cluster");
        }
        _ if leads => eprintln!(
            "removing node {node}, the leader: once the cluster without it is committed, it \
             stops leading and the other voters elect a leader"
        ),
        _ => eprintln!(
            "removing node {node}: a voter that is not the leader first stops voting (the \
             leader waits up to 5 s for it to hear so), then leaves the cluster"
        ),
    }
    let members = pending_apart(client.remove_node(node).await)?;
    outln!(
        "node {node} removed (if its process still runs, stop it now); the cluster's voters: {}",
        voters(&members)
    )?;
    let few = match members.iter().filter(|member| member.voter).count() {
        1 => Some(("1 voter", "it is")),
        2 => Some(("2 voters", "either is")),
        _ => None,
    };
    if let Some((voters, which)) = few {
        eprintln!(
            "note: with {voters} the cluster takes no change once {which} lost; 3 voters \
             survive the loss of 1, 5 the loss of 2"
        );
    }
    Ok(())
}

/// `broker cluster transfer`.
pub async fn transfer(server: &Server, args: TransferArgs) -> anyhow::Result<()> {
    let client = server.connect().await?;
    // Said only of a voter that does not lead (as far as the leader's view tells): anything
    // else is refused or answered at once.
    let hands_over = leader_view(server, &client).await.is_none_or(|status| {
        status.leader != Some(args.node_id)
            && status
                .members
                .iter()
                .any(|member| member.node_id == args.node_id && member.voter)
    });
    if hands_over {
        eprintln!(
            "asking the leader to hand its leadership over to node {} (changes pause until it \
             is elected)",
            args.node_id
        );
    }
    let status = client.transfer_leadership(args.node_id).await?;
    match status.leader {
        // Answered by the node named: it led already.
        Some(leader) if leader == status.node_id => outln!(
            "node {leader} leads the cluster already (term {})",
            status.term
        )?,
        Some(leader) => outln!("node {leader} leads the cluster (term {})", status.term)?,
        None => outln!(
            "the old leader follows now, and no new leader is known to it yet (term {}): \
             `broker cluster status` shows it",
            status.term
        )?,
    }
    Ok(())
}

/// `broker cluster move`.
pub async fn move_topic(server: &Server, args: MoveArgs) -> anyhow::Result<()> {
    let client = server.connect().await?;
    let metadata = client.metadata(Some(&args.topic)).await?;
    let addrs: Vec<&str> = metadata
        .nodes
        .iter()
        .map(|node| node.client_addr.as_str())
        .collect();
    let rows = groups(server, &addrs).await;
    let from = rows
        .iter()
        .find(|row| row.topics.contains(&args.topic))
        .map(|row| row.group);
    // A group no node knows is refused by the server, which says which groups there are:
    // announced only when the nodes know it.
    let known = rows.iter().any(|row| row.group == args.to);
    match from {
        _ if !known => {}
        Some(from) if from == args.to => {}
        Some(from) => eprintln!(
            "moving topic {} from group {from} to group {} (calls about it pause until it has \
             moved)",
            args.topic, args.to
        ),
        None => eprintln!(
            "moving topic {} to group {} (calls about it pause until it has moved)",
            args.topic, args.to
        ),
    }
    let placed = pending_apart(move_asking_again(&client, &args.topic, args.to).await)?;
    if from == Some(args.to) {
        outln!(
            "topic {} is in group {} already: nothing moved",
            args.topic,
            args.to
        )?;
        return Ok(());
    }
    let leader = placed
        .topics
        .iter()
        .find(|topic| topic.topic == args.topic)
        .and_then(|topic| topic.leader);
    let address = |id: u64| {
        placed
            .nodes
            .iter()
            .find(|node| node.node_id == id)
            .map_or("?", |node| node.client_addr.as_str())
    };
    match leader {
        Some(id) => outln!(
            "topic {} is in group {}, served by node {id} at {}",
            args.topic,
            args.to,
            address(id)
        )?,
        None => outln!(
            "topic {} is in group {}, whose leader is being elected: `broker cluster topics` \
             shows it in a moment",
            args.topic,
            args.to
        )?,
    }
    Ok(())
}

/// How long a move is asked again while the connection to the node asked is lost.
const MOVE_PATIENCE: Duration = Duration::from_secs(60);

/// [`Client::move_topic`], asked again (of the next node, once the client reconnects) when the
/// connection was lost or the answer was late: a move asked twice moves once, and answers at
/// once when the topic is where it is asked to be.
async fn move_asking_again(
    client: &Client,
    topic: &str,
    group: u32,
) -> Result<broker_client::BrokerMetadata, Error> {
    let deadline = std::time::Instant::now() + MOVE_PATIENCE;
    loop {
        match client.move_topic(topic, group).await {
            Err(error) if error.is_retriable() && std::time::Instant::now() < deadline => {
                eprintln!("asking again: {error}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            answered => return answered,
        }
    }
}

/// `broker cluster balance`.
pub async fn balance(server: &Server, args: BalanceArgs) -> anyhow::Result<()> {
    let client = server.connect().await?;
    let metadata = client.metadata(None).await?;
    if metadata.nodes.is_empty() {
        bail!("this server runs alone, not as a node of a cluster: it has no groups to balance");
    }
    let addrs: Vec<&str> = metadata
        .nodes
        .iter()
        .map(|node| node.client_addr.as_str())
        .collect();
    let rows = groups(server, &addrs).await;
    if rows.len() < 2 {
        bail!(
            "this cluster keeps every topic in one Raft group: start its nodes with \
             --cluster-data-groups N (every node the same) to spread topics over N groups"
        );
    }
    let described = client.describe().await?.topics;
    let weights: BTreeMap<&str, i64> = match args.by {
        BalanceBy::Partitions => metadata
            .topics
            .iter()
            .map(|topic| (topic.topic.as_str(), i64::from(topic.partition_count)))
            .collect(),
        BalanceBy::Bytes => described
            .iter()
            .map(|topic| {
                let bytes = i64::try_from(topic.retained_bytes).unwrap_or(i64::MAX);
                (topic.name.as_str(), bytes)
            })
            .collect(),
    };
    let mut layout: BTreeMap<u32, Vec<(String, i64)>> = rows
        .iter()
        .map(|row| {
            let topics = row
                .topics
                .iter()
                .filter_map(|topic| Some((topic.clone(), *weights.get(topic.as_str())?)))
                .collect();
            (row.group, topics)
        })
        .collect();
    let by = args.by;
    // A topic named as another's dead-letter or retry topic (orders-dlq) was placed with it:
    // they move together, as one unit of the plan named after the first.
    let units = companion_units(&mut layout);
    outln!("before: {}", loads(&layout, &units, by))?;
    // A topic tied to another by a dead-letter topic cannot move (the server says so): left
    // out of the plan from the start.
    let mut unmovable = BTreeSet::new();
    for topic in &described {
        let dead_letters: BTreeSet<String> = topic
            .groups
            .iter()
            .flat_map(|group| &group.settings)
            .filter_map(|setting| match setting {
                GroupSetting::DeadLetter(name) => Some(name.as_str().to_owned()),
                _ => None,
            })
            .filter(|name| *name != topic.name)
            .collect();
        if !dead_letters.is_empty() {
            let ties: Vec<String> = dead_letters.iter().cloned().collect();
            outln!(
                "leaving {} where it is: tied to {} by a dead-letter topic (both stay in one \
                 group)",
                topic.name,
                ties.join(", ")
            )?;
            unmovable.insert(topic.name.clone());
            unmovable.extend(dead_letters);
        }
    }
    // A topic holding more than a move takes is left out of the plan from the start too.
    for topic in &described {
        if topic.retained_bytes > broker_core::MAX_MOVE_BYTES {
            outln!(
                "leaving {} where it is: it holds {} of records, more than a move takes ({})",
                topic.name,
                crate::size::human(topic.retained_bytes),
                crate::size::human(broker_core::MAX_MOVE_BYTES)
            )?;
            unmovable.insert(topic.name.clone());
        }
    }
    // A unit with a topic that cannot move stays whole.
    let mut unmovable: BTreeSet<String> = units
        .iter()
        .filter(|(_, topics)| topics.iter().any(|topic| unmovable.contains(topic)))
        .map(|(unit, _)| unit.clone())
        .chain(unmovable.iter().cloned())
        .collect();
    let mut moved = 0;
    // Each plan lowers the measure next_moves goes by, or a topic becomes unmovable: it ends.
    'planning: loop {
        let moves = next_moves(&layout, &unmovable);
        if moves.is_empty() {
            break;
        }
        for planned in moves {
            let PlannedMove {
                topic,
                weight,
                from,
                to,
            } = &planned;
            let weight = weight_text(*weight, by);
            let topics = units
                .get(topic)
                .map_or_else(|| vec![topic.clone()], Clone::clone);
            let named = topics.join(" and ");
            if args.dry_run {
                moved += 1;
                outln!("would move {named} ({weight}) from group {from} to group {to}")?;
                planned.apply(&mut layout);
                continue;
            }
            let started = std::time::Instant::now();
            for (at, each) in topics.iter().enumerate() {
                match move_asking_again(&client, each, *to).await {
                    Ok(_) => {}
                    Err(Error::Broker(BrokerError::InvalidArgument(why))) if at == 0 => {
                        outln!("left {named} in group {from}: {why}")?;
                        unmovable.insert(topic.clone());
                        // The rest of a swap is planned again without it.
                        continue 'planning;
                    }
                    // Its companions moved, not it: the plan no longer knows the layout.
                    Err(Error::Broker(BrokerError::InvalidArgument(why))) => bail!(
                        "moved {} to group {to}, but {each} stays in group {from}: {why}; \
                         `broker cluster topics` shows where each topic is (run the balance \
                         again to plan from there)",
                        topics[..at].join(" and ")
                    ),
                    // A move that goes on past the server's wait: said so, exit status 3.
                    Err(error) => return pending_apart(Err(error)),
                }
            }
            outln!(
                "moved {named} ({weight}) from group {from} to group {to} in {:.1} s",
                started.elapsed().as_secs_f64()
            )?;
            planned.apply(&mut layout);
            moved += 1;
        }
    }
    let verb = if args.dry_run { "would be" } else { "after" };
    outln!("{verb}: {}", loads(&layout, &units, by))?;
    if moved == 0 {
        let what = match by {
            BalanceBy::Partitions => "partition counts",
            BalanceBy::Bytes => "retained bytes",
        };
        outln!("nothing to move: no move brings the groups' {what} closer together")?;
    }
    Ok(())
}

/// Each group's load and topics, on one line; `units` names the topics of each unit of the
/// layout that holds more than one.
fn loads(
    layout: &BTreeMap<u32, Vec<(String, i64)>>,
    units: &BTreeMap<String, Vec<String>>,
    by: BalanceBy,
) -> String {
    layout
        .iter()
        .map(|(group, held)| {
            let load: i64 = held.iter().map(|(_, weight)| weight).sum();
            let topics: usize = held
                .iter()
                .map(|(unit, _)| units.get(unit).map_or(1, Vec::len))
                .sum();
            format!(
                "group {group}: {} in {topics} topic{}",
                weight_text(load, by),
                plural(topics)
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Merges, in each group of `layout`, the topics named as another's dead-letter or retry topic
/// ([`broker_core::companions_of`]: `orders-dlq`, `orders-dlq-retry`) into the entry of the
/// topic they go with in that group, weights added; returns the topics of each merged entry,
/// by its name, that topic first.
fn companion_units(
    layout: &mut BTreeMap<u32, Vec<(String, i64)>>,
) -> BTreeMap<String, Vec<String>> {
    let mut units: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for held in layout.values_mut() {
        let names: BTreeSet<String> = held.iter().map(|(topic, _)| topic.clone()).collect();
        // The topic each one goes with in this group, following companions of companions.
        let root = |topic: &str| -> String {
            let mut at = topic.to_owned();
            loop {
                let base = broker_core::companions_of(&at).find(|base| names.contains(*base));
                match base.map(str::to_owned) {
                    Some(base) => at = base,
                    None => return at,
                }
            }
        };
        let mut merged: Vec<(String, i64)> = Vec::new();
        for (topic, weight) in held.drain(..) {
            let unit = root(&topic);
            if unit != topic {
                units.entry(unit.clone()).or_default().push(topic);
            }
            match merged.iter_mut().find(|(name, _)| *name == unit) {
                Some((_, total)) => *total += weight,
                None => merged.push((unit, weight)),
            }
        }
        *held = merged;
    }
    for (unit, companions) in &mut units {
        companions.sort();
        companions.insert(0, unit.clone());
    }
    units
}

/// A topic's or a group's load as balancing counts it: `3 partitions`, `1.20 MB (1.14 MiB)`.
fn weight_text(weight: i64, by: BalanceBy) -> String {
    match by {
        BalanceBy::Partitions => format!("{weight} partition{}", plural(weight)),
        BalanceBy::Bytes => crate::size::human(u64::try_from(weight).unwrap_or(0)),
    }
}

/// The next moves that bring the groups' loads closer together, measured by the sum of the
/// squares of the groups' loads (it falls whenever a move narrows a gap without opening a
/// wider one): the single move that lowers it most; when no single move does, the swap of two
/// topics between two groups (two moves) that lowers it most; empty once neither does. Topics
/// in `unmovable` are left out. `groups` maps each group to its topics and their weights
/// (partitions or bytes).
fn next_moves(
    groups: &BTreeMap<u32, Vec<(String, i64)>>,
    unmovable: &BTreeSet<String>,
) -> Vec<PlannedMove> {
    // Each group's load, added up once: the searches below look it up for every pair.
    let loads: BTreeMap<u32, i128> = groups
        .iter()
        .map(|(group, held)| (*group, held.iter().map(|(_, w)| i128::from(*w)).sum()))
        .collect();
    let load = |group: u32| loads[&group];
    // Moving `size` from a group of load `from` to one of load `to` lowers the sum of squares
    // by this much (positive: it narrows their gap). In i128: the squares of byte counts.
    let gain = |size: i128, from: i128, to: i128| 2 * size * (from - to - size);
    let movable = |group: u32| {
        groups[&group]
            .iter()
            .filter(|(topic, _)| !unmovable.contains(topic))
            .map(move |(topic, weight)| (topic, *weight))
    };
    let planned = |topic: &String, weight: i64, from: u32, to: u32| PlannedMove {
        topic: topic.clone(),
        weight,
        from,
        to,
    };
    let pairs: Vec<(u32, u32)> = groups
        .keys()
        .flat_map(|from| groups.keys().map(move |to| (*from, *to)))
        .filter(|(from, to)| from != to)
        .collect();
    // Ties: the larger topic, then the lower group ids, then the name.
    let single = pairs
        .iter()
        .flat_map(|&(from, to)| {
            movable(from).map(move |(topic, weight)| {
                let gain = gain(i128::from(weight), load(from), load(to));
                (gain, weight, from, to, topic)
            })
        })
        .filter(|(gain, ..)| *gain > 0)
        .max_by(|a, b| (a.0, a.1, b.2, b.3, b.4).cmp(&(b.0, b.1, a.2, a.3, a.4)));
    if let Some((_, weight, from, to, topic)) = single {
        return vec![planned(topic, weight, from, to)];
    }
    let swap = pairs
        .iter()
        .flat_map(|&(from, to)| {
            movable(from).flat_map(move |(topic, weight)| {
                movable(to)
                    .filter(move |(_, back)| *back < weight)
                    .map(move |(other, back)| {
                        let gain = gain(i128::from(weight - back), load(from), load(to));
                        (gain, weight, from, to, topic, back, other)
                    })
            })
        })
        .filter(|(gain, ..)| *gain > 0)
        .max_by(|a, b| (a.0, a.1, b.2, b.3, b.4, b.6).cmp(&(b.0, b.1, a.2, a.3, a.4, a.6)));
    swap.map_or_else(Vec::new, |(_, weight, from, to, topic, back, other)| {
        vec![
            planned(topic, weight, from, to),
            planned(other, back, to, from),
        ]
    })
}

/// One move of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PlannedMove {
    topic: String,
    /// Its partitions or its bytes, as the plan counts.
    weight: i64,
    from: u32,
    to: u32,
}

impl PlannedMove {
    /// Applies the move to `groups`.
    fn apply(&self, groups: &mut BTreeMap<u32, Vec<(String, i64)>>) {
        if let Some(topics) = groups.get_mut(&self.from) {
            topics.retain(|(topic, _)| *topic != self.topic);
        }
        groups
            .entry(self.to)
            .or_default()
            .push((self.topic.clone(), self.weight));
    }
}

/// What the leader knows of the cluster (a follower may not have applied the last membership
/// change yet), asked through `client` or at the leader's address; `None` if it cannot say.
/// Whether a further group (past the first) of the cluster, as the nodes `client`'s node
/// knows say, is one `matches`.
async fn any_group(server: &Server, client: &Client, matches: impl Fn(&GroupRow) -> bool) -> bool {
    let Ok(status) = client.cluster_status().await else {
        return false;
    };
    let addrs: Vec<&str> = status
        .members
        .iter()
        .map(|member| member.client_addr.as_str())
        .collect();
    groups(server, &addrs)
        .await
        .iter()
        .any(|row| row.group > 1 && matches(row))
}

async fn leader_view(server: &Server, client: &Client) -> Option<ClusterStatus> {
    let status = client.cluster_status().await.ok()?;
    let leader = status.leader?;
    if leader == status.node_id {
        return Some(status);
    }
    let member = status
        .members
        .iter()
        .find(|member| member.node_id == leader)?;
    ask(server, &member.client_addr).await.ok().filter(leads)
}

/// Whether `status` is the answer of a node that says it leads.
fn leads(status: &ClusterStatus) -> bool {
    status.leader == Some(status.node_id)
}

/// What the node at `addr` knows of the cluster, or why it could not say.
async fn ask(server: &Server, addr: &str) -> Result<ClusterStatus, String> {
    let asked = async {
        let client = server
            .builder()
            .connect_timeout(NODE_TIMEOUT)
            .request_timeout(NODE_TIMEOUT)
            .connect(addr)
            .await?;
        client.cluster_status().await
    };
    asked.await.map_err(|error| match error {
        // It answered: say what, not that it could not be asked.
        Error::Broker(BrokerError::InvalidArgument(why)) => why,
        other => anyhow!(other).to_string(),
    })
}

/// How many entries of the leader's log `member` lacks, as the leader knows. Not known when
/// the leader has not heard from it yet (as just after an election), nor when the leader's
/// last exchange with it failed: what it held then says nothing of what it lacks now.
fn behind(leader_last: Option<u64>, member: &ClusterMember) -> Option<u64> {
    if !member.reachable {
        return None;
    }
    Some(leader_last?.saturating_sub(member.matched_index?))
}

fn role_name(role: NodeRole) -> &'static str {
    match role {
        NodeRole::Leader => "leader",
        NodeRole::Follower => "follower",
        NodeRole::Candidate => "candidate",
        NodeRole::Learner => "learner",
        NodeRole::Stopped => "stopped",
    }
}

fn index(index: Option<u64>) -> String {
    index.map_or_else(|| "-".to_owned(), |index| index.to_string())
}

/// The voters' ids, `1, 2, 4`.
fn voters(members: &[ClusterMember]) -> String {
    members
        .iter()
        .filter(|member| member.voter)
        .map(|member| member.node_id.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(group: u32, leader: Option<u64>, voters: &[u64]) -> GroupRow {
        GroupRow {
            group,
            leader,
            term: 1,
            last_log_index: Some(1),
            behind: Vec::new(),
            voters: voters.to_vec(),
            topics: Vec::new(),
        }
    }

    fn row_with(group: u32, leader: Option<u64>, voters: &[u64], learners: &[u64]) -> GroupRow {
        GroupRow {
            behind: voters
                .iter()
                .chain(learners)
                .map(|id| (*id, Some(0)))
                .collect(),
            ..row(group, leader, voters)
        }
    }

    #[test]
    fn a_node_catching_up_with_other_groups_is_named_with_each_group() {
        let groups = [
            row_with(1, Some(1), &[1, 2, 3, 4], &[]),
            row_with(2, Some(2), &[1, 2, 3], &[4]),
            row_with(3, Some(3), &[1, 2, 3], &[4]),
            // A group electing tells nothing sure of its members.
            row_with(4, None, &[1, 2], &[3]),
            // Fewer replicas than nodes: node 4 holds no copy of group 5, as it should.
            row_with(5, Some(1), &[1, 2, 3], &[]),
        ];
        let lines = catching_up(&groups);
        assert_eq!(
            lines,
            [
                "node 4 is being added to groups 2 and 3: it catches up with the group's log as a \
              learner first, then votes"
            ]
        );
        assert!(catching_up(&groups[4..]).is_empty());
    }

    /// Groups holding the topics given with their partition counts.
    fn layout(groups: &[(u32, &[(&str, i64)])]) -> BTreeMap<u32, Vec<(String, i64)>> {
        groups
            .iter()
            .map(|(group, topics)| {
                let topics = topics
                    .iter()
                    .map(|(topic, partitions)| ((*topic).to_owned(), *partitions))
                    .collect();
                (*group, topics)
            })
            .collect()
    }

    /// Every move [`next_moves`] makes from `groups`, in order, with `unmovable` left alone.
    fn plan(groups: &[(u32, &[(&str, i64)])], unmovable: &[&str]) -> Vec<(String, u32, u32)> {
        let mut groups = layout(groups);
        let unmovable: BTreeSet<String> = unmovable.iter().map(|t| (*t).to_owned()).collect();
        let mut moves = Vec::new();
        loop {
            let planned = next_moves(&groups, &unmovable);
            if planned.is_empty() {
                break;
            }
            for planned in planned {
                planned.apply(&mut groups);
                moves.push((planned.topic, planned.from, planned.to));
            }
            assert!(moves.len() < 100, "a plan that never ends: {moves:?}");
        }
        moves
    }

    #[test]
    fn balancing_moves_the_topic_that_narrows_the_gaps_most_until_none_does() {
        let crowded: &[(&str, i64)] = &[("a", 4), ("b", 2), ("c", 1), ("d", 1)];
        let groups = [(1, crowded), (2, &[][..]), (3, &[("e", 1)][..])];
        // 8, 0, 1; then 4, 4, 1; then 2, 4, 3, where a (4 partitions) cannot narrow a gap of 2.
        let to = |topic: &str, from, to| (topic.to_owned(), from, to);
        assert_eq!(plan(&groups, &[]), [to("a", 1, 2), to("b", 1, 3)]);
        // A topic that cannot move stays, and the others are spread around it.
        assert_eq!(
            plan(&groups, &["a"]),
            [to("b", 1, 2), to("c", 1, 3), to("d", 1, 2)]
        );
        // Balanced already, or one group: nothing to do.
        let even = [(1, &[("a", 2)][..]), (2, &[("b", 1), ("c", 1)][..])];
        assert!(plan(&even, &[]).is_empty());
        assert!(plan(&[(1, crowded)], &[]).is_empty());
    }

    #[test]
    fn balancing_by_bytes_moves_the_topic_holding_most_without_overflowing() {
        let to = |topic: &str, from, to| (topic.to_owned(), from, to);
        // One large topic and two small: the large one moves, and the small ones stay.
        let groups = [
            (1, &[("big", 1000), ("s1", 10), ("s2", 10)][..]),
            (2, &[][..]),
        ];
        assert_eq!(plan(&groups, &[]), [to("big", 1, 2)]);
        // Petabytes: their squares exceed 64 bits.
        let huge = 4_000_000_000_000_000;
        let groups = [(1, &[("a", huge), ("b", huge)][..]), (2, &[][..])];
        assert_eq!(plan(&groups, &[]), [to("a", 1, 2)]);
    }

    #[test]
    fn a_topic_and_its_dead_letter_and_retry_topics_move_as_one() {
        let mut groups = layout(&[
            (
                1,
                &[
                    ("audit", 6),
                    ("clicks", 2),
                    ("orders", 4),
                    ("orders-dlq", 1),
                    ("orders-dlq-retry", 1),
                    ("payments", 1),
                ][..],
            ),
            (2, &[][..]),
            (3, &[("clicks-dlq", 1)][..]),
        ]);
        let units = companion_units(&mut groups);
        // A companion in another group than its topic's is a topic of its own there.
        assert_eq!(
            units,
            BTreeMap::from([(
                "orders".to_owned(),
                vec![
                    "orders".to_owned(),
                    "orders-dlq".to_owned(),
                    "orders-dlq-retry".to_owned()
                ]
            )])
        );
        assert_eq!(
            groups[&1],
            [
                ("audit".to_owned(), 6),
                ("clicks".to_owned(), 2),
                ("orders".to_owned(), 6),
                ("payments".to_owned(), 1)
            ]
        );
        assert_eq!(groups[&3], [("clicks-dlq".to_owned(), 1)]);
        let units_as_given: Vec<(u32, Vec<(&str, i64)>)> = groups
            .iter()
            .map(|(group, held)| {
                let held = held.iter().map(|(t, w)| (t.as_str(), *w)).collect();
                (*group, held)
            })
            .collect();
        let given: Vec<(u32, &[(&str, i64)])> = units_as_given
            .iter()
            .map(|(group, held)| (*group, &held[..]))
            .collect();
        // 15, 0, 1: the unit of orders (6 partitions) moves whole; 4, 6, 6 at the end.
        let to = |topic: &str, from, to| (topic.to_owned(), from, to);
        assert_eq!(
            plan(&given, &[]),
            [
                to("audit", 1, 2),
                to("orders", 1, 3),
                to("clicks-dlq", 3, 1)
            ]
        );
    }

    #[test]
    fn when_no_single_move_narrows_a_gap_two_topics_swap_groups() {
        // 7, 7, 9: no topic of the third group is small enough to move alone.
        let groups = [
            (1, &[("a1", 2), ("a2", 2), ("a3", 2), ("a4", 1)][..]),
            (2, &[("b", 7)][..]),
            (3, &[("c1", 3), ("c2", 3), ("c3", 3)][..]),
        ];
        let to = |topic: &str, from, to| (topic.to_owned(), from, to);
        // 8, 7, 8.
        assert_eq!(plan(&groups, &[]), [to("c1", 3, 1), to("a1", 1, 3)]);
        // Not only the fullest group gives: 4, 0, 3 ends at 4, 1, 2.
        let groups = [
            (1, &[("x", 4)][..]),
            (2, &[][..]),
            (3, &[("y", 1), ("z", 1), ("w", 1)][..]),
        ];
        assert_eq!(plan(&groups, &[]), [to("w", 3, 2)]);
    }
}
