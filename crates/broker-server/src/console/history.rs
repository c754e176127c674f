//! What the console charts: each topic's end offsets (its throughput, once differentiated) and
//! each group's lag, sampled at a fixed interval over the last minutes, in memory.

use std::collections::{HashMap, VecDeque};

use broker_core::TopicDescription;
use serde::Serialize;

/// One topic's, or one group's, samples: the latest last, aligned with the end of
/// [`History::times`] (a series younger than the history holds fewer).
type Series = VecDeque<i64>;

/// The last samples of every topic and group, `capacity` of each at most.
#[derive(Debug)]
pub(crate) struct History {
    capacity: usize,
    /// When each sample was taken, in milliseconds since the Unix epoch, oldest first.
    times: VecDeque<i64>,
    /// Per topic: the sum of its partitions' end offsets.
    ends: HashMap<String, Series>,
    /// Per topic, per group: the sum of the group's lag on the topic's partitions.
    lags: HashMap<String, HashMap<String, Series>>,
}

/// A topic's samples as the console's API answers them.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(crate) struct TopicHistory {
    /// When each sample was taken, in milliseconds since the Unix epoch, oldest first.
    pub(crate) times: Vec<i64>,
    /// The sum of the topic's end offsets at each of the last `ends.len()` times.
    pub(crate) ends: Vec<i64>,
    /// Each group's lag on the topic at each of its last samples' times, by group name.
    pub(crate) lags: Vec<(String, Vec<i64>)>,
}

impl History {
    /// An empty history keeping `capacity` samples (at least one) of each series.
    pub(crate) fn new(capacity: usize) -> History {
        History {
            capacity: capacity.max(1),
            times: VecDeque::new(),
            ends: HashMap::new(),
            lags: HashMap::new(),
        }
    }

    /// Adds a sample of `topics` taken at `at_ms`. A topic or group missing from it (deleted)
    /// loses its series.
    pub(crate) fn record(&mut self, at_ms: i64, topics: &[TopicDescription]) {
        push(&mut self.times, at_ms, self.capacity);
        let capacity = self.capacity;
        let mut ends = HashMap::with_capacity(topics.len());
        let mut lags = HashMap::with_capacity(topics.len());
        for topic in topics {
            let mut series = self.ends.remove(&topic.name).unwrap_or_default();
            push(&mut series, topic.end_offsets(), capacity);
            ends.insert(topic.name.clone(), series);
            let mut before = self.lags.remove(&topic.name).unwrap_or_default();
            let groups: HashMap<String, Series> = topic
                .groups
                .iter()
                .map(|group| {
                    let mut series = before.remove(&group.name).unwrap_or_default();
                    push(&mut series, group.lag(), capacity);
                    (group.name.clone(), series)
                })
                .collect();
            lags.insert(topic.name.clone(), groups);
        }
        self.ends = ends;
        self.lags = lags;
    }

    /// `topic`'s samples, empty if it has none.
    pub(crate) fn of(&self, topic: &str) -> TopicHistory {
        let mut lags: Vec<(String, Vec<i64>)> = self
            .lags
            .get(topic)
            .map(|groups| {
                groups
                    .iter()
                    .map(|(group, series)| (group.clone(), series.iter().copied().collect()))
                    .collect()
            })
            .unwrap_or_default();
        lags.sort();
        TopicHistory {
            times: self.times.iter().copied().collect(),
            ends: self
                .ends
                .get(topic)
                .map(|series| series.iter().copied().collect())
                .unwrap_or_default(),
            lags,
        }
    }
}

/// Appends `value` to `series`, dropping its oldest beyond `capacity`.
fn push(series: &mut Series, value: i64, capacity: usize) {
    if series.len() == capacity {
        series.pop_front();
    }
    series.push_back(value);
}

#[cfg(test)]
mod tests {
    use super::*;
    use broker_core::EventBroker;

    /// `broker`'s topics as the history samples them.
    fn topics(broker: &EventBroker) -> Vec<TopicDescription> {
        broker.describe().topics
    }

    #[test]
    fn each_series_keeps_its_last_samples_and_leaves_with_its_topic_or_group() {
        let broker = EventBroker::new(100).unwrap();
        broker.create("orders", 2).unwrap();
        broker.create("audit", 1).unwrap();
        let mut history = History::new(3);
        history.record(1_000, &topics(&broker));
        broker.publish("orders", 0, "a").unwrap();
        broker.publish("orders", 1, "b").unwrap();
        broker.join("orders", "billing", "m1").unwrap();
        history.record(2_000, &topics(&broker));
        broker.publish("orders", 1, "c").unwrap();
        history.record(3_000, &topics(&broker));
        broker.poll("orders", "billing", "m1", 1).unwrap();
        history.record(4_000, &topics(&broker));
        let orders = history.of("orders");
        // Three samples kept: the first is gone.
        assert_eq!(orders.times, [2_000, 3_000, 4_000]);
        assert_eq!(orders.ends, [2, 3, 3]);
        // The group appeared at the second sample. Its lag counts from its start.
        assert_eq!(orders.lags, [("billing".to_owned(), vec![2, 3, 3])]);
        assert_eq!(history.of("audit").ends, [0, 0, 0]);
        broker.delete_topic("audit").unwrap();
        history.record(5_000, &topics(&broker));
        assert_eq!(history.of("audit").ends, Vec::<i64>::new());
        assert_eq!(history.of("orders").ends, [3, 3, 3]);
        // A topic never seen has no samples, only the times.
        assert_eq!(history.of("missing").times, [3_000, 4_000, 5_000]);
    }
}
