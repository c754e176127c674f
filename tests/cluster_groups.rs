//! A cluster of three real `broker-server` processes spreading its topics over three Raft
//! groups (`--cluster-data-groups 3`), through the real client given every node's address:
//! the groups are created and their leaders spread over the nodes by themselves, new topics go
//! to different groups, every call about a topic is served by its group's leader (the client
//! follows `NotLeader`), a listing gathers every group from any node, and a node's `kill -9`
//! loses nothing acknowledged; with fewer replicas than nodes, each group's copies are
//! spread round robin and kept at their number as nodes leave, and every node serves every
//! topic.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use broker_client::{Client, Error, GroupSetting, KeyHash, Retention, TopicName, TopicSetting};
use broker_testkit::cluster::{Nodes, PATIENCE};
use broker_testkit::http::get as http_get;

/// How long the groups may take to be created and their leaders spread.
const SETTLING: Duration = Duration::from_secs(60);

/// How long a node that does not lead may take to apply what a call answered has changed.
const APPLIED_WITHIN: Duration = Duration::from_secs(10);

/// How many requests the running nodes answered `NotLeader`, all together.
fn not_leader_answers(nodes: &Nodes) -> i64 {
    (0..nodes.running.len())
        .filter_map(|index| nodes.running[index].as_ref())
        .map(|node| {
            let (_, _, text) = http_get(node.metrics_addr.unwrap(), "/metrics", "");
            text.lines()
                .filter(|line| {
                    line.starts_with("broker_request_errors_total{")
                        && line.contains("error=\"not_leader\"")
                })
                .filter_map(|line| line.rsplit_once(' ')?.1.parse::<i64>().ok())
                .sum::<i64>()
        })
        .sum()
}

/// The topics of a group of `broker cluster status --json`, in its order.
fn topics_of(group: &serde_json::Value) -> Vec<&str> {
    group["topics"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|topic| topic.as_str())
        .collect()
}

/// Runs `call` until it answers: a call whose connection was lost (its node died) is asked
/// again. Only for calls that change nothing when asked twice.
async fn again<T, F: std::future::Future<Output = Result<T, Error>>>(call: impl Fn() -> F) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match call().await {
            Ok(answer) => return answer,
            Err(error) if Instant::now() < deadline => {
                eprintln!("asking again after: {error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("{error:?}"),
        }
    }
}

/// Every payload left for the group `g` of `topic`, fetched and committed until none is.
async fn drain(client: &Client, topic: &str) -> Vec<String> {
    let mut payloads = Vec::new();
    loop {
        let records = again(|| client.fetch(topic, "g", "m", 1_000)).await;
        if records.is_empty() {
            return payloads;
        }
        again(|| client.commit(topic, "g", "m", None)).await;
        payloads.extend(
            records
                .iter()
                .map(|record| String::from_utf8(record.payload.to_vec()).unwrap()),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_spread_over_groups_whose_leaders_spread_over_the_nodes() {
    let mut nodes = Nodes::start_with(
        3,
        None,
        &[
            "--cluster-data-groups",
            "3",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    let leaders = nodes.spread(3, SETTLING);
    eprintln!("groups' leaders: {leaders:?}");
    let client = nodes.client().await;
    let topics = ["apples", "bananas", "cherries"];
    for topic in topics {
        assert!(client.create(topic, 2).await.unwrap(), "{topic} created");
    }
    // Each in a group of its own (the one holding the fewest partitions).
    let placed = nodes.samples_of(0, "topic_shard", &topics, APPLIED_WITHIN);
    let shards: BTreeSet<i64> = topics.iter().map(|topic| placed[*topic]).collect();
    assert_eq!(shards.len(), 3, "{placed:?}");
    // Each node tells each group's term and indexes; each group's leader, how far each member
    // has its log.
    for index in 0..3 {
        let terms = nodes.samples(index, "cluster_group_term");
        assert_eq!(terms.len(), 3, "node {index}: {terms:?}");
        assert!(terms.values().all(|term| *term >= 1), "{terms:?}");
        let applied = nodes.samples(index, "cluster_group_applied_index");
        assert_eq!(applied.len(), 3, "node {index}: {applied:?}");
    }
    for (group, leader) in &leaders {
        let node = nodes.running[usize::try_from(*leader - 1).unwrap()]
            .as_ref()
            .unwrap();
        let (_, _, text) = http_get(node.metrics_addr.unwrap(), "/metrics", "");
        let prefix = format!("broker_cluster_group_replicated_index{{group=\"{group}\",node=\"");
        let members = text
            .lines()
            .filter(|line| line.starts_with(&prefix))
            .count();
        assert_eq!(members, 3, "group {group} on its leader {leader}:\n{text}");
    }
    // A topic named after another with -dlq goes with it, whichever group that is; a group
    // names it as its dead-letter topic.
    for topic in topics {
        let dead_letter = format!("{topic}-dlq");
        assert!(client.create(&dead_letter, 1).await.unwrap());
        let named = TopicName::new(&dead_letter).unwrap();
        let settings = [
            GroupSetting::MaxDeliveries(3),
            GroupSetting::DeadLetter(named),
        ];
        client.join(topic, "g", "m").await.unwrap();
        client.configure_group(topic, "g", &settings).await.unwrap();
    }
    let dead_letters: Vec<String> = topics.iter().map(|topic| format!("{topic}-dlq")).collect();
    let named: Vec<&str> = dead_letters.iter().map(String::as_str).collect();
    let placed = nodes.samples_of(1, "topic_shard", &named, APPLIED_WITHIN);
    for topic in topics {
        assert_eq!(placed[&format!("{topic}-dlq")], placed[topic], "{placed:?}");
    }
    // A dead-letter topic in another group than its topic is refused, saying why.
    let elsewhere = TopicName::new("cherries-dlq").unwrap();
    let refused = client
        .configure_group("apples", "g", &[GroupSetting::DeadLetter(elsewhere)])
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("must be in its topic's group"),
        "{refused}"
    );
    // A dead-letter topic not created yet is placed in its topic's group when a group names
    // it, and created there later.
    let late = TopicName::new("late-letters").unwrap();
    let settings = [
        GroupSetting::MaxDeliveries(3),
        GroupSetting::DeadLetter(late),
    ];
    client
        .configure_group("bananas", "g", &settings)
        .await
        .unwrap();
    assert!(client.create("late-letters", 1).await.unwrap());
    let placed = nodes.samples_of(0, "topic_shard", &["late-letters"], APPLIED_WITHIN);
    assert_eq!(placed["late-letters"], placed["bananas"], "{placed:?}");
    let settings = [
        GroupSetting::MaxDeliveries(3),
        GroupSetting::DeadLetter(TopicName::new("bananas-dlq").unwrap()),
    ];
    client
        .configure_group("bananas", "g", &settings)
        .await
        .unwrap();
    // Each topic's calls are served by its group's leader; metadata says which.
    let metadata = client.metadata(None).await.unwrap();
    let served_by: BTreeSet<_> = metadata
        .topics
        .iter()
        .filter(|topic| topics.contains(&topic.topic.as_str()))
        .map(|topic| topic.leader)
        .collect();
    assert_eq!(served_by.len(), 3, "{metadata:?}");
    for topic in topics {
        for index in 0..50 {
            let payload = format!("{topic}-{index}");
            client
                .publish(topic, index % 2, payload.into_bytes())
                .await
                .unwrap();
        }
    }
    // One client keeps a connection to each topic's leader: calls about the three topics, in
    // turn, are answered where they are sent.
    let refused_before = not_leader_answers(&nodes);
    for round in 0..20 {
        for topic in topics {
            client.end_offset(topic, round % 2).await.unwrap();
        }
    }
    assert_eq!(
        not_leader_answers(&nodes),
        refused_before,
        "calls sent elsewhere"
    );
    // A listing from any node gathers every group.
    let listed = client.describe().await.unwrap();
    let names: Vec<&str> = listed.topics.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "apples",
            "apples-dlq",
            "bananas",
            "bananas-dlq",
            "cherries",
            "cherries-dlq",
            "late-letters"
        ]
    );
    // `broker cluster status` shows every group: its leader (the one the metrics name), how
    // far each member is, and its topics.
    let cli = |args: &[&str]| {
        let mut command = std::process::Command::new(broker_testkit::process::binary("broker"));
        command.args(["--addr", &nodes.addresses()]).args(args);
        let output = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        String::from_utf8(output.stdout).unwrap()
    };
    let status: serde_json::Value =
        serde_json::from_str(&cli(&["cluster", "status", "--json"])).unwrap();
    let groups = status["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 3, "{status}");
    let placed = nodes.samples(0, "topic_shard");
    for group in groups {
        let id = group["group"].as_i64().unwrap();
        assert_eq!(
            group["leader"].as_i64(),
            Some(leaders[&id.to_string()]),
            "{status}"
        );
        assert_eq!(group["behind"].as_array().unwrap().len(), 3, "{status}");
        let held: BTreeSet<&str> = topics_of(group).into_iter().collect();
        let expected: BTreeSet<&str> = placed
            .iter()
            .filter(|(_, shard)| **shard + 1 == id)
            .map(|(topic, _)| topic.as_str())
            .collect();
        assert_eq!(held, expected, "group {id}: {status}");
    }
    let text = cli(&["cluster", "status"]);
    eprintln!("broker cluster status:\n{text}");
    let rows: Vec<&str> = text
        .lines()
        .skip_while(|line| !line.starts_with("group"))
        .skip(1)
        .collect();
    assert_eq!(rows.len(), 3, "{text}");
    // Each row ends with its group's topics.
    for (row, group) in rows.iter().zip(groups) {
        let topics = topics_of(group);
        assert!(row.ends_with(&topics.join(", ")), "{row} / {topics:?}");
    }
    // `broker cluster topics` names each topic's group and the node that serves it.
    let listed: serde_json::Value =
        serde_json::from_str(&cli(&["cluster", "topics", "--json"])).unwrap();
    for topic in listed["topics"].as_array().unwrap() {
        let name = topic["topic"].as_str().unwrap();
        let group = placed[name] + 1;
        assert_eq!(topic["group"].as_i64(), Some(group), "{listed}");
        let leader = leaders[&group.to_string()];
        assert_eq!(topic["leader"].as_i64(), Some(leader), "{listed}");
    }
    assert_eq!(listed["topics"].as_array().unwrap().len(), 7, "{listed}");
    let text = cli(&["cluster", "topics", "bananas"]);
    assert!(text.contains("bananas"), "{text}");
    assert!(!text.contains("apples"), "{text}");

    // The node leading the group of "bananas" dies: that group elects another leader, the
    // others go on, and nothing acknowledged is lost.
    let group_of_bananas = (nodes.samples(0, "topic_shard")["bananas"] + 1).to_string();
    let victim = usize::try_from(leaders[&group_of_bananas] - 1).unwrap();
    nodes.kill(victim);
    // With a node down, topics are still created.
    // (Asked again after a lost connection, it may answer that the topic exists.)
    again(|| client.create("dates", 1)).await;
    for topic in topics {
        for index in 50..60 {
            let payload = format!("{topic}-{index}");
            again(|| client.publish(topic, index % 2, payload.clone().into_bytes())).await;
        }
    }
    for topic in topics {
        let mut read = drain(&client, topic).await;
        read.sort();
        read.dedup();
        let mut expected: Vec<String> = (0..60).map(|index| format!("{topic}-{index}")).collect();
        expected.sort();
        assert_eq!(read, expected, "{topic}");
    }
    // Back, the node catches up and takes its share of leaders again.
    nodes.restart(victim);
    nodes.spread(3, SETTLING);
    let listed = again(|| client.describe()).await;
    let ends: Vec<i64> = listed
        .topics
        .iter()
        .filter(|topic| topics.contains(&topic.name.as_str()))
        .map(|topic| topic.partitions.iter().map(|p| p.end_offset).sum())
        .collect();
    assert_eq!(ends, [60, 60, 60]);
    assert!(listed.topics.iter().any(|topic| topic.name == "dates"));
}

/// Each group's members, by group, as the node at `addr` knows them (voters and learners).
async fn members_by_group(addr: std::net::SocketAddr) -> BTreeMap<u32, Vec<(u64, bool)>> {
    let client = Client::connect(addr.to_string().as_str()).await.unwrap();
    client
        .groups_status()
        .await
        .unwrap()
        .into_iter()
        .map(|group| {
            let members = group.status.members.iter();
            let members = members
                .map(|member| (member.node_id, member.voter))
                .collect();
            (group.group, members)
        })
        .collect()
}

/// Waits until the node at `addr` sees every group with exactly the voters `voters`.
async fn groups_have(addr: std::net::SocketAddr, groups: usize, voters: &[u64]) {
    let expected: Vec<(u64, bool)> = voters.iter().map(|id| (*id, true)).collect();
    let deadline = Instant::now() + SETTLING;
    loop {
        let seen = members_by_group(addr).await;
        if seen.len() == groups && seen.values().all(|members| *members == expected) {
            return;
        }
        assert!(Instant::now() < deadline, "{seen:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_added_and_one_removed_join_and_leave_every_group() {
    // More replicas than nodes: every node a voter of every group.
    let mut nodes = Nodes::start_with(
        3,
        None,
        &[
            "--cluster-data-groups",
            "3",
            "--cluster-replicas",
            "9",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    nodes.spread(3, SETTLING);
    let client = nodes.client().await;
    let topics = ["apples", "bananas", "cherries"];
    for topic in topics {
        assert!(client.create(topic, 2).await.unwrap(), "{topic} created");
        for index in 0..20 {
            let payload = format!("{topic}-{index}");
            client
                .publish(topic, index % 2, payload.into_bytes())
                .await
                .unwrap();
        }
    }
    // A fourth node, started to join, is added: to the first group, and by each group's leader
    // to its group, before the call answers.
    let (joiner, entry) = nodes.start_joiner();
    let (id, addresses) = entry.split_once('=').unwrap();
    let (peer, client_addr) = addresses.split_once('/').unwrap();
    let members = client
        .add_node(id.parse().unwrap(), peer, client_addr)
        .await
        .unwrap();
    assert_eq!(members.len(), 4, "{members:?}");
    let joined = nodes.client_addrs[joiner];
    // As the other nodes and the joiner itself see the groups.
    groups_have(nodes.client_addrs[1], 3, &[1, 2, 3, 4]).await;
    groups_have(joined, 3, &[1, 2, 3, 4]).await;
    // Its copy of each group holds that group's topics.
    let held: BTreeSet<String> = Client::connect(joined.to_string().as_str())
        .await
        .unwrap()
        .groups_status()
        .await
        .unwrap()
        .into_iter()
        .flat_map(|group| group.topics)
        .collect();
    assert_eq!(held, topics.iter().map(ToString::to_string).collect());
    // The leaders spread over the four nodes (three groups: three leaders).
    nodes.spread(3, SETTLING);

    // Node 1 is removed, then stopped: every group goes on without it.
    // (Within the default request timeout: the removal waits for the groups to follow.)
    let patient = Client::connect(nodes.addresses().as_str()).await.unwrap();
    let removing = Instant::now();
    patient.remove_node(1).await.unwrap();
    eprintln!("node 1 removed in {:?}", removing.elapsed());
    nodes.kill(0);
    groups_have(nodes.client_addrs[1], 3, &[2, 3, 4]).await;
    groups_have(joined, 3, &[2, 3, 4]).await;
    let client = Client::builder()
        .request_timeout(Duration::from_secs(5))
        .connect(
            (1..4)
                .map(|index| nodes.client_addrs[index].to_string())
                .collect::<Vec<_>>()
                .join(",")
                .as_str(),
        )
        .await
        .unwrap();
    for topic in topics {
        for index in 20..30 {
            let payload = format!("{topic}-{index}");
            again(|| client.publish(topic, index % 2, payload.clone().into_bytes())).await;
        }
    }
    for topic in topics {
        again(|| client.join(topic, "g", "m")).await;
        let mut read = drain(&client, topic).await;
        read.sort();
        read.dedup();
        let mut expected: Vec<String> = (0..30).map(|index| format!("{topic}-{index}")).collect();
        expected.sort();
        assert_eq!(read, expected, "{topic}");
    }
}

/// Waits until each running node holds a copy of exactly the groups `expected` gives it, each
/// with the voters `expected` lists (as that node sees them).
async fn copies_are(nodes: &Nodes, expected: &BTreeMap<u32, Vec<u64>>) {
    let deadline = Instant::now() + SETTLING;
    loop {
        let mut seen = BTreeMap::new();
        for (index, addr) in nodes.client_addrs.iter().enumerate() {
            if nodes.running[index].is_none() {
                continue;
            }
            let id = u64::try_from(index).unwrap() + 1;
            let voters: BTreeMap<u32, Vec<u64>> = members_by_group(*addr)
                .await
                .into_iter()
                .map(|(group, members)| {
                    let voting = members.into_iter().filter(|(_, votes)| *votes);
                    (group, voting.map(|(id, _)| id).collect())
                })
                .collect();
            seen.insert(id, voters);
        }
        let as_expected = seen.iter().all(|(id, voters)| {
            let mine = expected.iter().filter(|(_, holders)| holders.contains(id));
            *voters
                == mine
                    .map(|(group, holders)| (*group, holders.clone()))
                    .collect()
        });
        if as_expected {
            return;
        }
        assert!(Instant::now() < deadline, "{seen:?}, not {expected:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_of_three_replicas_over_four_nodes_serve_every_topic_from_any_node() {
    let mut nodes = Nodes::start_with(
        4,
        None,
        &[
            "--cluster-data-groups",
            "4",
            "--cluster-replicas",
            "3",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    let leaders = nodes.spread(4, SETTLING);
    eprintln!("groups' leaders: {leaders:?}");
    // Round robin: group 2 on nodes 1 to 3, group 3 on nodes 2 to 4, group 4 on nodes 3, 4
    // and 1; the first group on every node.
    let mut expected: BTreeMap<u32, Vec<u64>> = BTreeMap::from([
        (1, vec![1, 2, 3, 4]),
        (2, vec![1, 2, 3]),
        (3, vec![2, 3, 4]),
        (4, vec![1, 3, 4]),
    ]);
    copies_are(&nodes, &expected).await;
    let client = nodes.client().await;
    let topics = ["apples", "bananas", "cherries", "dates"];
    for topic in topics {
        assert!(client.create(topic, 2).await.unwrap(), "{topic} created");
    }
    // One topic in each group: the node creating them counted the partitions of the groups
    // it holds no copy of too.
    let placed: BTreeMap<String, i64> = (0..4)
        .flat_map(|index| nodes.samples(index, "topic_shard"))
        .collect();
    let groups: BTreeSet<i64> = topics.iter().map(|topic| placed[*topic]).collect();
    assert_eq!(groups.len(), 4, "{placed:?}");
    // A client given one node only, for each node: every topic is served, by its group's
    // leader, which a node holding no copy of the group names.
    for index in 0..4 {
        let addr = nodes.client_addrs[index].to_string();
        let alone = Client::connect(addr.as_str()).await.unwrap();
        for topic in topics {
            for partition in 0..2 {
                let payload = format!("{topic}-{index}-{partition}");
                again(|| alone.publish(topic, partition, payload.clone().into_bytes())).await;
            }
        }
        // A listing from that node gathers every group, those it holds no copy of too.
        let listed = again(|| alone.describe()).await;
        let names: Vec<&str> = listed.topics.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, topics, "node {}", index + 1);
        // (A group electing a leader names none for a moment.)
        let metadata = again(|| async {
            let metadata = alone.metadata(None).await?;
            match metadata.topics.iter().find(|topic| topic.leader.is_none()) {
                Some(topic) => Err(Error::Server(broker_client::ErrorReply::Pending(format!(
                    "no leader named for {}",
                    topic.topic
                )))),
                None => Ok(metadata),
            }
        })
        .await;
        for topic in &metadata.topics {
            let group = (placed[&topic.topic] + 1).to_string();
            assert_eq!(
                topic.leader,
                leaders.get(&group).map(|id| u64::try_from(*id).unwrap()),
                "{metadata:?}"
            );
        }
    }

    // `broker cluster topics`, given node 1 only (which holds no copy of group 3), names every
    // topic's group and leader. (A node learns the leader of a group it holds no copy of by
    // asking that group's members: a listing made while it asks names none yet.)
    let deadline = Instant::now() + APPLIED_WITHIN;
    loop {
        let output = std::process::Command::new(broker_testkit::process::binary("broker"))
            .args(["--addr", &nodes.client_addrs[0].to_string()])
            .args(["cluster", "topics", "--json"])
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let listed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let topics = listed["topics"].as_array().unwrap();
        for topic in topics {
            let group = placed[topic["topic"].as_str().unwrap()] + 1;
            assert_eq!(topic["group"].as_i64(), Some(group), "{listed}");
        }
        let leaders_named = topics.iter().all(|topic| {
            let group = placed[topic["topic"].as_str().unwrap()] + 1;
            topic["leader"].as_i64() == Some(leaders[&group.to_string()])
        });
        if leaders_named {
            break;
        }
        assert!(Instant::now() < deadline, "{listed}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Node 3, a voter of every further group, dies and is removed: each group replaces it
    // with the node it lacks, nothing acknowledged is lost.
    nodes.kill(2);
    let survivors = [0, 1, 3]
        .iter()
        .map(|index| nodes.client_addrs[*index].to_string())
        .collect::<Vec<_>>()
        .join(",");
    let client = Client::builder()
        .request_timeout(Duration::from_secs(5))
        .connect(survivors.as_str())
        .await
        .unwrap();
    remove_node(&client, 3).await;
    // Every group on nodes 1, 2 and 4.
    let three_nodes: BTreeMap<u32, Vec<u64>> =
        (1..=4).map(|group| (group, vec![1, 2, 4])).collect();
    copies_are(&nodes, &three_nodes).await;
    for topic in topics {
        for partition in 0..2 {
            let payload = format!("{topic}-after-{partition}");
            again(|| client.publish(topic, partition, payload.clone().into_bytes())).await;
        }
        // Enough for each group's files to tell a copy from none.
        for index in 0..BULK_RECORDS {
            let payload = format!("{topic}-bulk-{index}-{}", "x".repeat(4_000));
            again(|| client.publish(topic, index % 2, payload.clone().into_bytes())).await;
        }
    }
    // Node 5 joins: the groups whose order now puts it among their first three take a copy
    // on it, each giving up the node that is no longer among them (group 3: 2, 4, 5, 1; group
    // 4: 4, 5, 1, 2), its leader handing the group over first when that is itself.
    let (joiner, entry) = nodes.start_joiner();
    let (id, addresses) = entry.split_once('=').unwrap();
    assert_eq!(id, "5");
    let (peer, client_addr) = addresses.split_once('/').unwrap();
    again(|| client.add_node(5, peer, client_addr)).await;
    expected = BTreeMap::from([
        (1, vec![1, 2, 4, 5]),
        (2, vec![1, 2, 4]),
        (3, vec![2, 4, 5]),
        (4, vec![1, 4, 5]),
    ]);
    copies_are(&nodes, &expected).await;
    // The nodes whose copies were given up drop them: node 1's of group 3, node 2's of group
    // 4. A node that kept its copy still holds the records.
    given_up_copy_dropped(&nodes, 0, 3).await;
    given_up_copy_dropped(&nodes, 1, 4).await;
    assert!(group_files_bytes(&nodes, 1, 3) > 150_000);
    let joined = Client::connect(nodes.client_addrs[joiner].to_string().as_str())
        .await
        .unwrap();
    let listed = again(|| joined.describe()).await;
    let names: Vec<&str> = listed.topics.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, topics);
    for topic in topics {
        again(|| client.join(topic, "g", "m")).await;
        let mut read = drain(&client, topic).await;
        read.sort();
        read.dedup();
        let bulk = format!("{topic}-bulk-");
        let bulk_read = read
            .iter()
            .filter(|payload| payload.starts_with(&bulk))
            .count();
        assert_eq!(bulk_read, BULK_RECORDS as usize, "{topic}");
        read.retain(|payload| !payload.starts_with(&bulk));
        let mut expected: Vec<String> = (0..4)
            .flat_map(|index| (0..2).map(move |partition| format!("{topic}-{index}-{partition}")))
            .chain((0..2).map(|partition| format!("{topic}-after-{partition}")))
            .collect();
        expected.sort();
        assert_eq!(read, expected, "{topic}");
    }
    // Node 1, restarted, waits to be added to group 3 again instead of starting it anew from
    // its empty directory (it was one of the group's first voters).
    nodes.kill(0);
    nodes.restart(0);
    copies_are(&nodes, &expected).await;
    // Node 5 leaves: group 3 takes node 1 again, which receives everything anew, and group 4
    // node 2.
    remove_node(&client, 5).await;
    nodes.kill(joiner);
    copies_are(&nodes, &three_nodes).await;
    let deadline = Instant::now() + SETTLING;
    while group_files_bytes(&nodes, 0, 3) < 150_000 || group_files_bytes(&nodes, 1, 4) < 150_000 {
        assert!(
            Instant::now() < deadline,
            "the copies taken again are not filled"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Removes node `id` from the cluster through `client`, asking again until it is gone: a
/// removal whose answer timed out may have been applied, and is then answered that the node is
/// not a member.
async fn remove_node(client: &Client, id: u64) {
    again(|| async {
        match client.remove_node(id).await {
            Err(Error::Broker(broker_client::BrokerError::InvalidArgument(why)))
                if why.contains(&format!("node {id} is not a member")) =>
            {
                Ok(Vec::new())
            }
            answer => answer,
        }
    })
    .await;
}

/// How many records of 4 KB each topic of `groups_of_three_replicas_over_four_nodes...` is
/// given before a node joins.
const BULK_RECORDS: i32 = 50;

/// The bytes of the files node `index` keeps of group `group`.
fn group_files_bytes(nodes: &Nodes, index: usize, group: u32) -> u64 {
    fn bytes(path: &std::path::Path) -> u64 {
        let Ok(entries) = std::fs::read_dir(path) else {
            return 0;
        };
        entries
            .flatten()
            .map(|entry| match entry.file_type() {
                Ok(kind) if kind.is_dir() => bytes(&entry.path()),
                _ => entry.metadata().map_or(0, |metadata| metadata.len()),
            })
            .sum()
    }
    bytes(&nodes.dir(index).join(format!("raft/group-{group}")))
}

/// Waits until node `index` has dropped its copy of group `group`, which the group gave up:
/// its files of the group hold nothing but what an empty copy has.
async fn given_up_copy_dropped(nodes: &Nodes, index: usize, group: u32) {
    let dir = nodes.dir(index).join(format!("raft/group-{group}"));
    let deadline = Instant::now() + SETTLING;
    loop {
        let bytes = group_files_bytes(nodes, index, group);
        if dir.join("given-up").exists() && bytes < 16_384 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {} keeps {bytes} bytes of group {group}",
            index + 1
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The group holding `topic`, as node `index`'s metrics place it (its shard, counted from 0),
/// once they name it: a node applies a create or a move a moment after the group's leader.
fn group_of(nodes: &Nodes, index: usize, topic: &str) -> Option<i64> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let placed = nodes.samples(index, "topic_shard").get(topic).copied();
        if placed.is_some() || Instant::now() >= deadline {
            return placed.map(|shard| shard + 1);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// [`group_of`], waiting until it is `group` (for up to 20 seconds): a node applies a move a
/// moment after the first group's leader commits it.
fn placed_in(nodes: &Nodes, index: usize, topic: &str, group: i64) -> Option<i64> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let placed = group_of(nodes, index, topic);
        if placed == Some(group) || Instant::now() >= deadline {
            return placed;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `broker` with `args` against every node; its exit status, standard output and error.
fn broker_cli(nodes: &Nodes, args: &[&str]) -> (Option<i32>, String, String) {
    let output = std::process::Command::new(broker_testkit::process::binary("broker"))
        .args(["--addr", &nodes.addresses()])
        .args(args)
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

/// A topic moves to another group while a client publishes to it: nothing acknowledged is
/// lost or stored twice, offsets and the group's committed offsets stay, the group consumes
/// on from where it was, and the topic's calls reach it in its new group. `broker cluster
/// move` says where it went; an unknown group, and a topic tied to another by a dead-letter
/// topic, are refused saying why; every node restarted keeps it where it went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_moves_to_another_group_while_a_client_publishes_to_it() {
    let mut nodes = Nodes::start_with(
        3,
        None,
        &[
            "--cluster-data-groups",
            "3",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    nodes.spread(3, SETTLING);
    let client = nodes.client().await;
    // Limits retention, so that records no group consumed do not fill the partitions.
    let limits = [TopicSetting::Retention(Retention::Limits)];
    let created = client
        .create_topic("orders", 2, KeyHash::default(), &limits)
        .await
        .unwrap();
    assert!(created);
    let from = group_of(&nodes, 0, "orders").unwrap();
    let to = from % 3 + 1;
    for index in 0..200 {
        let payload = format!("before-{index}");
        client.publish("orders", index % 2, payload).await.unwrap();
    }
    // The group takes and commits 100 of them.
    client.join("orders", "g", "m").await.unwrap();
    let mut consumed = 0;
    while consumed < 100 {
        consumed += client
            .fetch("orders", "g", "m", 100 - consumed)
            .await
            .unwrap()
            .len() as i32;
    }
    client.commit("orders", "g", "m", None).await.unwrap();
    let committed: Vec<i64> = vec![
        client.committed("orders", "g", 0).await.unwrap(),
        client.committed("orders", "g", 1).await.unwrap(),
    ];
    // A client publishes while the topic moves, and 50 more after, asking again when told to
    // (a call answered NotLeader changed nothing).
    let publisher = nodes.client().await;
    let moved = Arc::new(AtomicBool::new(false));
    let publishing = tokio::spawn({
        let moved = Arc::clone(&moved);
        async move {
            let (mut asked_again, mut after) = (0, 0);
            for index in 0..5_000 {
                let payload = format!("during-{index}");
                loop {
                    match publisher
                        .publish("orders", index % 2, payload.clone())
                        .await
                    {
                        Ok(offset) => {
                            assert!(offset >= 0, "{payload} refused");
                            break;
                        }
                        Err(Error::Server(broker_client::ErrorReply::NotLeader { .. })) => {
                            asked_again += 1;
                            assert!(asked_again < 1_000, "never served again");
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Err(error) => panic!("{payload}: {error:?}"),
                    }
                }
                if moved.load(Ordering::SeqCst) {
                    after += 1;
                    if after == 50 {
                        return (index + 1, asked_again);
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            panic!("the move did not end while 5,000 records were published");
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let refused_before = not_leader_answers(&nodes);
    let to_text = to.to_string();
    let moving = {
        let nodes_addresses = nodes.addresses();
        let args = ["cluster", "move", "orders", "--to", &to_text].map(str::to_owned);
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(broker_testkit::process::binary("broker"))
                .args(["--addr", &nodes_addresses])
                .args(args)
                .output()
                .unwrap()
        })
        .await
        .unwrap()
    };
    moved.store(true, Ordering::SeqCst);
    let said = String::from_utf8_lossy(&moving.stdout);
    assert!(moving.status.success(), "{moving:?}");
    assert!(
        said.contains(&format!("topic orders is in group {to}, served by node")),
        "{said}"
    );
    assert!(
        !publishing.is_finished(),
        "the publisher ran through the move"
    );
    let (published, asked_again) = publishing.await.unwrap();
    eprintln!(
        "{published} published while the topic moved and after; the publisher was told to ask \
         again {asked_again} times, the nodes answered NotLeader {} times meanwhile",
        not_leader_answers(&nodes) - refused_before
    );
    for index in 0..3 {
        assert_eq!(
            placed_in(&nodes, index, "orders", to),
            Some(to),
            "node {index}"
        );
    }

    // Every record once, at the offset it was given, in order.
    let mut payloads = Vec::new();
    let mut ends = Vec::new();
    for partition in 0..2 {
        let read = client
            .read("orders", partition, 0, 10_000, Duration::ZERO)
            .await
            .unwrap();
        let end = 100
            + (0..published)
                .filter(|index| index % 2 == partition)
                .count() as i64;
        assert_eq!(read.start_offset, 0);
        assert_eq!(read.end_offset, end, "partition {partition}");
        let offsets: Vec<i64> = read.records.iter().map(|record| record.offset).collect();
        assert_eq!(offsets, (0..end).collect::<Vec<i64>>());
        ends.push(end);
        payloads.extend(
            read.records
                .iter()
                .map(|record| String::from_utf8(record.payload.to_vec()).unwrap()),
        );
    }
    let expected: BTreeSet<String> = (0..200)
        .map(|index| format!("before-{index}"))
        .chain((0..published).map(|index| format!("during-{index}")))
        .collect();
    assert_eq!(payloads.len(), expected.len());
    assert_eq!(payloads.into_iter().collect::<BTreeSet<_>>(), expected);
    // The group's offsets moved with it: it consumes on from where it committed.
    for partition in 0..2 {
        let offset = client.committed("orders", "g", partition).await.unwrap();
        assert_eq!(offset, committed[partition as usize]);
    }
    let rest = drain(&client, "orders").await;
    assert_eq!(rest.len(), 100 + published as usize, "{rest:?}");
    let (code, listed, _) = broker_cli(&nodes, &["cluster", "topics", "orders", "--json"]);
    assert_eq!(code, Some(0));
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed["topics"][0]["group"].as_i64(), Some(to), "{listed}");

    // Refused, saying why: an unknown group, a topic tied by a dead-letter topic.
    let (code, _, said) = broker_cli(&nodes, &["cluster", "move", "orders", "--to", "9"]);
    assert_eq!(code, Some(1));
    assert!(said.contains("has no group 9"), "{said}");
    assert!(
        !said.contains("moving topic"),
        "announced before refused: {said}"
    );
    let settings = [
        GroupSetting::MaxDeliveries(3),
        GroupSetting::DeadLetter(TopicName::new("orders-dlq").unwrap()),
    ];
    client.join("orders", "audit", "a").await.unwrap();
    client
        .configure_group("orders", "audit", &settings)
        .await
        .unwrap();
    let (code, _, said) = broker_cli(&nodes, &["cluster", "move", "orders", "--to", "1"]);
    assert_eq!(code, Some(1));
    assert!(said.contains("tied to orders-dlq"), "{said}");
    assert_eq!(group_of(&nodes, 0, "orders"), Some(to), "it stayed");
    client.publish("orders", 0, "after").await.unwrap();

    // Every node restarted: the topic is where it went, whole.
    for index in 0..3 {
        nodes.kill(index);
        nodes.restart(index);
    }
    nodes.spread(3, SETTLING);
    let client = nodes.client().await;
    let read = again(|| client.read("orders", 0, 0, 10_000, Duration::ZERO)).await;
    assert_eq!(read.end_offset, ends[0] + 1);
    assert_eq!(again(|| client.committed("orders", "g", 0)).await, ends[0]);
    let (code, listed, _) = broker_cli(&nodes, &["cluster", "topics", "orders", "--json"]);
    assert_eq!(code, Some(0));
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed["topics"][0]["group"].as_i64(), Some(to), "{listed}");
}

/// `broker cluster balance` spreads topics gathered in one group over every group, one move at
/// a time, each keeping its records, a topic and its dead-letter topic (`t5-dlq`) together;
/// `--dry-run` says what it would do and does nothing; once balanced, it has nothing to move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn balancing_spreads_the_topics_of_one_group_over_every_group() {
    let nodes = Nodes::start_with(
        3,
        None,
        &[
            "--cluster-data-groups",
            "3",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    nodes.spread(3, SETTLING);
    let client = nodes.client().await;
    let topics = ["t1", "t2", "t3", "t4", "t5", "t5-dlq"];
    for topic in topics {
        assert!(client.create(topic, 1).await.unwrap());
        client.publish(topic, 0, topic.to_owned()).await.unwrap();
        client.move_topic(topic, 1).await.unwrap();
        assert_eq!(placed_in(&nodes, 0, topic, 1), Some(1));
    }
    let per_group = || {
        let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
        for topic in topics {
            *counts
                .entry(group_of(&nodes, 0, topic).unwrap())
                .or_default() += 1;
        }
        counts
    };
    assert_eq!(per_group(), BTreeMap::from([(1, 6)]));

    let (code, planned, said) = broker_cli(&nodes, &["cluster", "balance", "--dry-run"]);
    assert_eq!(code, Some(0), "{said}");
    let would: Vec<&str> = planned
        .lines()
        .filter(|line| line.starts_with("would move"))
        .collect();
    // The unit of t5 and t5-dlq first (it narrows the gap most), then one topic, then another.
    assert_eq!(would.len(), 3, "{planned}");
    assert!(
        would[0].starts_with("would move t5 and t5-dlq (2 partitions) from group 1"),
        "{planned}"
    );
    assert!(
        planned.contains("would be: group 1: 2 partitions in 2 topics; group 2: 2 partitions"),
        "{planned}"
    );
    assert_eq!(
        per_group(),
        BTreeMap::from([(1, 6)]),
        "a dry run moves nothing"
    );

    let (code, done, said) = broker_cli(&nodes, &["cluster", "balance"]);
    assert_eq!(code, Some(0), "{said}");
    eprintln!("{done}");
    assert_eq!(
        done.lines()
            .filter(|line| line.starts_with("moved "))
            .count(),
        3,
        "{done}"
    );
    // As node 1 places them, once it applied the last move.
    let balanced = BTreeMap::from([(1, 2), (2, 2), (3, 2)]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while per_group() != balanced {
        assert!(Instant::now() < deadline, "{:?}", per_group());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(group_of(&nodes, 0, "t5"), group_of(&nodes, 0, "t5-dlq"));
    for topic in topics {
        let read = client.read(topic, 0, 0, 10, Duration::ZERO).await.unwrap();
        let payloads: Vec<&[u8]> = read.records.iter().map(|r| &r.payload[..]).collect();
        assert_eq!(payloads, [topic.as_bytes()], "{topic}");
    }
    let (code, again, _) = broker_cli(&nodes, &["cluster", "balance"]);
    assert_eq!(code, Some(0));
    assert!(again.contains("nothing to move"), "{again}");
}

/// Raising `--cluster-data-groups` one node at a time: the first group's leader, restarted
/// with the higher value first, adds the new group only once every node serves it (a group
/// some node does not serve would have no majority there), then at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_group_is_added_only_once_every_node_serves_it() {
    let flags = |groups: &'static str| {
        [
            "--cluster-data-groups",
            groups,
            "--metrics-listen",
            "127.0.0.1:0",
        ]
    };
    let mut nodes = Nodes::start_with(3, None, &flags("2"));
    nodes.spread(2, SETTLING);
    nodes.set_extra_flags(&flags("3"));
    let leader = nodes.leader().await;
    nodes.kill(leader);
    nodes.restart(leader);
    // It leads the first group again (a restart hands the leadership to another node).
    let client = nodes.client().await;
    let deadline = Instant::now() + SETTLING;
    while nodes.leader().await != leader {
        assert!(
            Instant::now() < deadline,
            "node {leader} did not lead again"
        );
        let _ = client.transfer_leadership(leader as u64 + 1).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Several of its rounds of adding groups (one a second) go by: the third waits.
    let addr = nodes.client_addrs[leader];
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let groups = members_by_group(addr).await;
        assert_eq!(
            groups.len(),
            2,
            "a group added before every node serves it: {groups:?}"
        );
    }
    for other in (0..3).filter(|index| *index != leader) {
        nodes.kill(other);
        nodes.restart(other);
    }
    let leaders = nodes.spread(3, SETTLING);
    assert_eq!(leaders.len(), 3, "{leaders:?}");
}

/// A group's memory budget is part of its replicated state (every replica must refuse the same
/// publishes as full), so a node restarted from a snapshot takes the budget of when the
/// snapshot was written. Restarted with a smaller `--max-memory`, the group's leader proposes
/// its share instead: publishes that the old budget had room for are refused as full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_restored_from_a_snapshot_takes_the_budget_of_the_restarted_nodes() {
    let flags = |memory: &'static str| {
        [
            "--cluster-data-groups",
            "1",
            "--cluster-snapshot-entries",
            "10",
            "--capacity",
            "100000",
            "--max-payload-bytes",
            "1KiB",
            "--max-memory",
            memory,
        ]
    };
    let mut nodes = Nodes::start_with(3, None, &flags("64KiB"));
    let client = nodes.client().await;
    again(|| client.create("t", 1)).await;
    // The group that frees room later reads from the start.
    again(|| client.join("t", "g", "m")).await;
    let record = "x".repeat(1000);
    // 40 KB retained: within 64 KiB, past 32 KiB; and snapshots written (every 10 entries).
    for _ in 0..40 {
        let offset = again(|| client.publish("t", 0, record.clone())).await;
        assert!(offset >= 0, "refused under the first budget");
    }
    nodes.set_extra_flags(&flags("32KiB"));
    for index in 0..3 {
        nodes.kill(index);
        nodes.restart(index);
    }
    let client = nodes.client().await;
    let deadline = Instant::now() + SETTLING;
    loop {
        let offset = again(|| client.publish("t", 0, "y")).await;
        if offset < 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "publishes still taken past the new budget (offset {offset})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Consumed records leave, and publishes are taken again under the new budget.
    again(|| client.join("t", "g", "m")).await;
    let drained = drain(&client, "t").await;
    assert!(drained.len() >= 40, "{} records drained", drained.len());
    assert!(again(|| client.publish("t", 0, record.clone())).await >= 0);
}
