//! A Kafka consumer's assignment as its group's leader encodes it for SyncGroup (Kafka's
//! `ConsumerProtocolAssignment`, versions 0 to 3: a version, then each topic with its
//! partitions, then user data this module does not need), read to show which partitions each
//! member of a group consumes.
//!
//! Read here rather than by the generated decoder: the bytes come from a client, and the
//! generated decoder reserves room for as many entries as a count claims before it reads one,
//! so a few bytes could ask for gigabytes. Here a count is believed only as far as the bytes
//! left could hold its entries.

use std::collections::{BTreeMap, BTreeSet};

use broker_core::TopicPartitions;

/// The longest assignment read: a quarter of a million partitions, far more than a group's
/// member is ever given. Read, an assignment takes up to about ten times its bytes (a short
/// topic name becomes a string and a list of its own), so a longer one a client made up is
/// not read: it would make every listing of the groups take that much for a moment.
pub(crate) const MOST_READ_BYTES: usize = 1024 * 1024;

/// The partitions `assignment` gives its member, by topic name (each topic once, its
/// partitions ascending and each once); `None` if it is not a consumer's assignment (too
/// short, a negative length, a name that is not UTF-8) or is longer than [`MOST_READ_BYTES`].
pub(crate) fn assigned_partitions(assignment: &[u8]) -> Option<Vec<TopicPartitions>> {
    if assignment.len() > MOST_READ_BYTES {
        return None;
    }
    let mut input = Input(assignment);
    if input.i16()? < 0 {
        return None;
    }
    // A topic takes at least its name's length and its partitions' count.
    let topics = input.count(2 + 4)?;
    let mut assigned: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
    for _ in 0..topics {
        let name_length = usize::try_from(input.i16()?).ok()?;
        let name = std::str::from_utf8(input.bytes(name_length)?).ok()?;
        let partitions = input.count(4)?;
        let entry = assigned.entry(name.to_owned()).or_default();
        for _ in 0..partitions {
            entry.insert(input.i32()?);
        }
    }
    Some(
        assigned
            .into_iter()
            .map(|(topic, partitions)| TopicPartitions {
                topic,
                partitions: partitions.into_iter().collect(),
            })
            .collect(),
    )
}

/// What is left to read, big-endian as Kafka encodes.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn bytes(&mut self, count: usize) -> Option<&'a [u8]> {
        if self.0.len() < count {
            return None;
        }
        let (taken, rest) = self.0.split_at(count);
        self.0 = rest;
        Some(taken)
    }

    fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.bytes(2)?.try_into().ok()?))
    }

    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.bytes(4)?.try_into().ok()?))
    }

    /// An array's count of entries of at least `entry_bytes` each: `None` if it is negative
    /// or more than the bytes left could hold.
    fn count(&mut self, entry_bytes: usize) -> Option<usize> {
        let count = usize::try_from(self.i32()?).ok()?;
        (count.checked_mul(entry_bytes)? <= self.0.len()).then_some(count)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::testing::consumer_assignment as encoded;

    fn partitions(topic: &str, partitions: &[i32]) -> TopicPartitions {
        TopicPartitions {
            topic: topic.to_owned(),
            partitions: partitions.to_vec(),
        }
    }

    #[test]
    fn an_assignment_of_every_version_is_read_by_topic() {
        for version in 0..=3 {
            let bytes = encoded(
                version,
                &[("orders", &[3, 1]), ("audit", &[0]), ("orders", &[1, 2])],
            );
            assert_eq!(
                assigned_partitions(&bytes),
                Some(vec![
                    partitions("audit", &[0]),
                    partitions("orders", &[1, 2, 3])
                ]),
                "version {version}"
            );
        }
        assert_eq!(assigned_partitions(&encoded(1, &[])), Some(Vec::new()));
    }

    #[test]
    fn bytes_that_are_not_an_assignment_are_none_whatever_their_counts_claim() {
        let whole = encoded(0, &[("orders", &[0, 1])]);
        for cut in 0..whole.len() - 4 {
            // (Cut before the user data: the partitions are all there from then on.)
            if cut < whole.len() - 4 - 4 - "user data".len() {
                assert_eq!(assigned_partitions(&whole[..cut]), None, "cut at {cut}");
            }
        }
        // A count of two billion topics, or partitions, in a few bytes.
        let mut huge_topics = 0i16.to_be_bytes().to_vec();
        huge_topics.extend(i32::MAX.to_be_bytes());
        assert_eq!(assigned_partitions(&huge_topics), None);
        let mut huge_partitions = 0i16.to_be_bytes().to_vec();
        huge_partitions.extend(1i32.to_be_bytes());
        huge_partitions.extend(1i16.to_be_bytes());
        huge_partitions.push(b't');
        huge_partitions.extend(i32::MAX.to_be_bytes());
        assert_eq!(assigned_partitions(&huge_partitions), None);
        // Longer than what is read (a real one of that length would assign 250,000 partitions).
        let partitions: Vec<i32> = (0..MOST_READ_BYTES as i32 / 4).collect();
        let long = encoded(0, &[("t", &partitions)]);
        assert!(long.len() > MOST_READ_BYTES);
        assert_eq!(assigned_partitions(&long), None);
        // A negative version or name length, a name that is not UTF-8.
        assert_eq!(assigned_partitions(&(-1i16).to_be_bytes()), None);
        let mut bad_name = 0i16.to_be_bytes().to_vec();
        bad_name.extend(1i32.to_be_bytes());
        bad_name.extend(1i16.to_be_bytes());
        bad_name.push(0xff);
        bad_name.extend(0i32.to_be_bytes());
        assert_eq!(assigned_partitions(&bad_name), None);
    }
}
