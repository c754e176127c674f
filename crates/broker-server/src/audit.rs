//! Info-level log lines for the changes an operator reconstructs the broker's history from
//! (see `CommandKind::is_administrative`): topics created, grown, purged and deleted, members
//! joining and leaving with the group's new assignment, groups reset, configured and deleted,
//! topics' settings changed (what the change named and the settings after it).

use broker_core::{
    BrokerState, Command, DeadLettered, GroupSettings, MemberDescription, Outcome, TopicSetting,
    TopicSettings,
};
use tracing::{info, warn};

/// Logs `command`, which changed `state` (already applied) with `outcome`.
pub(crate) fn log_change(state: &BrokerState, command: &Command, outcome: &Outcome) {
    match command {
        Command::Create {
            topic,
            partition_count,
            key_hash,
            settings,
        } => info!(
            topic,
            partitions = partition_count,
            key_hash = %key_hash,
            settings = %TopicSettings::from_list(settings)
                .map(|settings| settings.to_string())
                .unwrap_or_else(|_| format!("{settings:?}")),
            "topic created"
        ),
        Command::AddPartitions {
            topic,
            partition_count,
        } => info!(topic, partitions = partition_count, "partitions added"),
        Command::DeleteTopic { topic } => info!(topic, "topic deleted"),
        Command::Purge {
            topic,
            partition,
            before,
        } => info!(
            topic,
            partition,
            before,
            earliest_offset = match outcome {
                Outcome::Offset(offset) => *offset,
                _ => -1,
            },
            "records purged"
        ),
        Command::Join {
            topic,
            group,
            member,
            ..
        } => info!(
            topic,
            group,
            member,
            assignment = %assignment(&state.members(topic, group)),
            "member joined; group rebalanced"
        ),
        Command::Leave {
            topic,
            group,
            member,
        } => info!(
            topic,
            group,
            member,
            assignment = %assignment(&state.members(topic, group)),
            "member left; group rebalanced"
        ),
        Command::ResetGroup {
            topic,
            group,
            partitions,
            to,
        } => info!(
            topic,
            group,
            partitions = partitions
                .as_ref()
                .map_or_else(|| "all".to_owned(), |partitions| format!("{partitions:?}")),
            to = ?to,
            "group offsets reset"
        ),
        Command::DeleteGroup { topic, group } => info!(topic, group, "group deleted"),
        Command::DeleteOffsets {
            topic,
            group,
            partitions,
        } => info!(
            topic,
            group,
            partitions = ?partitions,
            "group offsets deleted"
        ),
        Command::ConfigureGroup { topic, group, .. } => info!(
            topic,
            group,
            settings = %settings_text(outcome),
            "group settings changed"
        ),
        Command::ConfigureTopic { topic, settings } => info!(
            topic,
            changed = %setting_list(settings),
            settings = %match outcome {
                Outcome::TopicSettings(list) => TopicSettings::from_list(list)
                    .map(|settings| settings.to_string())
                    .unwrap_or_else(|_| format!("{list:?}")),
                other => other.name().to_owned(),
            },
            "topic settings changed"
        ),
        Command::Publish { .. }
        | Command::PublishKeyed { .. }
        | Command::PublishBatch { .. }
        | Command::PublishUntilFull { .. }
        | Command::PublishIdempotent { .. }
        | Command::Poll { .. }
        | Command::Ack { .. }
        | Command::AckAndPoll { .. }
        | Command::Retry { .. }
        | Command::RetryAfter { .. }
        | Command::Redeliver { .. }
        | Command::Fetch { .. }
        | Command::Commit { .. }
        | Command::Assignment { .. }
        | Command::Committed { .. }
        | Command::EndOffset { .. }
        | Command::Lag { .. }
        | Command::Describe { .. }
        | Command::Producers { .. }
        | Command::StoredOffsets { .. }
        | Command::KafkaGroups
        | Command::OffsetForTime { .. }
        | Command::Read { .. }
        | Command::CommitGroup { .. }
        // The server logs membership and leadership changes itself; none reaches the broker's
        // state.
        | Command::ClusterStatus
        | Command::GroupsStatus
        | Command::AddNode { .. }
        | Command::RemoveNode { .. }
        | Command::TransferLeadership { .. }
        | Command::MoveTopic { .. }
        | Command::Metadata { .. } => {}
    }
}

/// A group's settings as `GroupSettings::fmt` words (`start at earliest, ...`).
fn settings_text(outcome: &Outcome) -> String {
    match outcome {
        Outcome::GroupSettings(list) => GroupSettings::from_list(list)
            .map(|settings| settings.to_string())
            .unwrap_or_else(|_| format!("{list:?}")),
        other => other.name().to_owned(),
    }
}

/// The settings a change named, as `max 2 records, max age 1h` (`nothing` for none).
fn setting_list(settings: &[TopicSetting]) -> String {
    if settings.is_empty() {
        return "nothing".to_owned();
    }
    settings
        .iter()
        .map(TopicSetting::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Logs a record moved to its group's dead-letter topic, or (a warning) one that topic could not
/// take.
pub(crate) fn log_dead_letter(moved: &DeadLettered) {
    if moved.created_dead_letter {
        info!(
            topic = moved.dead_letter,
            partitions = 1,
            group = moved.group,
            "dead-letter topic created (limits retention)"
        );
    }
    match moved.stored_at {
        Some((dead_letter_partition, dead_letter_offset)) => info!(
            topic = moved.topic,
            partition = moved.partition,
            offset = moved.offset,
            group = moved.group,
            deliveries = moved.deliveries,
            reason = moved.reason.name(),
            dead_letter = moved.dead_letter,
            dead_letter_partition,
            dead_letter_offset,
            "record dead-lettered"
        ),
        None => warn!(
            topic = moved.topic,
            partition = moved.partition,
            offset = moved.offset,
            group = moved.group,
            deliveries = moved.deliveries,
            dead_letter = moved.dead_letter,
            "the dead-letter topic cannot take a record past its last delivery (full, the memory \
             budget, or the maximum of topics); delivering it again"
        ),
    }
}

/// The group's members and their partitions, as `m1=[0, 2] m2=[1]` (`no members` when none is
/// left). It takes the group's members alone: a join or leave logs in the time its group takes,
/// however many other groups its topic has.
fn assignment(members: &[MemberDescription]) -> String {
    if members.is_empty() {
        return "no members".to_owned();
    }
    members
        .iter()
        .map(|member| format!("{}={:?}", member.member, member.partitions))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assignment_names_each_member_with_its_partitions() {
        let member = |name: &str, partitions: &[i32]| MemberDescription {
            member: name.to_owned(),
            partitions: partitions.to_vec(),
        };
        assert_eq!(
            assignment(&[member("m1", &[0, 2]), member("m2", &[1])]),
            "m1=[0, 2] m2=[1]"
        );
        assert_eq!(assignment(&[]), "no members");
    }

    #[test]
    fn a_change_of_settings_names_what_it_changed() {
        let named = [
            TopicSetting::MaxRecords(2),
            TopicSetting::MaxAgeMs(3_600_000),
        ];
        assert_eq!(setting_list(&named), "max 2 records, max age 1h");
        assert_eq!(setting_list(&[]), "nothing");
    }
}
