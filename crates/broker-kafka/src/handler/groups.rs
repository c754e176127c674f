//! Kafka's classic consumer-group protocol as the listener coordinates it: JoinGroup, SyncGroup,
//! LeaveGroup, DescribeGroups, ListGroups and DeleteGroups (Heartbeat is answered by the
//! coordinator alone).

use std::collections::BTreeMap;
use std::time::Duration;

use broker_proto::ErrorReply;
use bytes::Bytes;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{
    DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest, DescribeGroupsResponse,
    GroupId, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse,
    LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse, SyncGroupRequest,
    SyncGroupResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use tokio::time::Instant;

use broker_core::{Command, Outcome, TopicDescription};

use crate::errors::{code, coordinator_error};
use crate::groups::{Join, CONSUMER_PROTOCOL, DEAD};
use crate::native_groups::ADOPTION_LOOK_AGE;
use crate::Backend;

use super::{unexpected, Handler};

/// The session timeouts a member may ask for, in milliseconds: 1 s to 30 min (a rebalance
/// waits at most as long).
const SESSION_TIMEOUT_MS: std::ops::RangeInclusive<i32> = 1_000..=1_800_000;

/// `ms` milliseconds (never negative).
fn millis(ms: i32) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// How often a JoinGroup refused for a group with native members is logged as a warning.
const REFUSAL_WARNING_EVERY: Duration = Duration::from_secs(10);

/// The state Kafka gives a group with committed offsets and no members.
const EMPTY: &str = "Empty";

impl<B: Backend> Handler<'_, B> {
    pub(super) async fn join_group(
        &self,
        request: JoinGroupRequest,
        client_id: &str,
    ) -> JoinGroupResponse {
        let group = request.group_id.as_str().to_owned();
        let refused = |error: ResponseError| {
            JoinGroupResponse::default()
                .with_error_code(error.code())
                .with_generation_id(-1)
                .with_member_id(request.member_id.clone())
        };
        if !self.is_group_id(&group) {
            return refused(ResponseError::InvalidGroupId);
        }
        if !SESSION_TIMEOUT_MS.contains(&request.session_timeout_ms) {
            return refused(ResponseError::InvalidSessionTimeout);
        }
        // A group name is used by one protocol at a time: claimed first, so that a native
        // join applied after this look finds the claim, and one applied before it is seen.
        let _claim = self.state.groups.claim(&group);
        match self.has_native_members(&group).await {
            Ok(false) => {}
            Ok(true) => {
                self.warn_native_group(&group, client_id);
                return refused(ResponseError::InconsistentGroupProtocol);
            }
            Err(refusal) => return refused(coordinator_error(&refusal)),
        }
        let session_timeout = millis(request.session_timeout_ms);
        // Version 0 has no rebalance timeout: it is the session timeout.
        let rebalance_timeout = match request.rebalance_timeout_ms {
            timeout if timeout > 0 => millis(timeout.min(*SESSION_TIMEOUT_MS.end())),
            _ => session_timeout,
        };
        let join = Join {
            member_id: request.member_id.as_str().to_owned(),
            client_id: client_id.to_owned(),
            client_host: self.client_host.clone(),
            protocol_type: request.protocol_type.as_str().to_owned(),
            protocols: request
                .protocols
                .iter()
                // Copied: a member keeps it for its life, which must not keep the request's
                // whole buffer alive.
                .map(|protocol| {
                    (
                        protocol.name.as_str().to_owned(),
                        Bytes::copy_from_slice(&protocol.metadata),
                    )
                })
                .collect(),
            session_timeout,
            rebalance_timeout,
        };
        match self.state.groups.join(&group, join).await {
            Ok((member_id, round)) => {
                let leads = round.leader == member_id;
                JoinGroupResponse::default()
                    .with_generation_id(round.generation)
                    .with_protocol_type(Some(request.protocol_type))
                    .with_protocol_name(Some(StrBytes::from_string(round.protocol)))
                    .with_leader(StrBytes::from_string(round.leader))
                    .with_member_id(StrBytes::from_string(member_id))
                    .with_members(if leads {
                        round
                            .members
                            .into_iter()
                            .map(|(id, metadata)| {
                                JoinGroupResponseMember::default()
                                    .with_member_id(StrBytes::from_string(id))
                                    .with_metadata(metadata)
                            })
                            .collect()
                    } else {
                        Vec::new()
                    })
            }
            Err(error) => refused(error),
        }
    }

    /// Logs why a JoinGroup for `group` was refused: the client gets a code without text. A
    /// warning at most every [`REFUSAL_WARNING_EVERY`] (a client retries its join again and
    /// again), the others at debug level.
    fn warn_native_group(&self, group: &str, client_id: &str) {
        let now = Instant::now();
        let due = {
            let mut warned = self
                .state
                .refusal_warned
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let due = warned.is_none_or(|at| now.duration_since(at) >= REFUSAL_WARNING_EVERY);
            if due {
                *warned = Some(now);
            }
            due
        };
        let client = &self.client_host;
        let why = "a Kafka consumer cannot join this group: members that joined natively (the \
                   broker's own clients) use its name, and a group name is used by one protocol \
                   at a time; it is refused with INCONSISTENT_GROUP_PROTOCOL";
        match due {
            true => tracing::warn!(group, client_id, %client, "{why}"),
            false => tracing::debug!(group, client_id, %client, "{why}"),
        }
    }

    /// A member's heartbeat (see `Coordinator::heartbeat`).
    pub(super) async fn heartbeat(&self, request: &HeartbeatRequest) -> HeartbeatResponse {
        let group = request.group_id.as_str();
        let answer = if self.is_group_id(group) {
            let member = (request.member_id.as_str(), request.generation_id);
            let may_adopt = self.may_adopt(group, member).await;
            self.state
                .groups
                .heartbeat(group, member.0, member.1, may_adopt)
                .await
        } else {
            Err(ResponseError::InvalidGroupId)
        };
        HeartbeatResponse::default().with_error_code(code(answer.err()))
    }

    /// Whether the coordinator may take a member of `group` in to rebuild it (see the groups
    /// module): not when a group of that name has members that joined natively (a group name
    /// is used by one protocol at a time). Asked only of a group the coordinator does not
    /// hold, whose members come back after a restart or a failover, all at once: they share
    /// a look at the broker up to [`ADOPTION_LOOK_AGE`] old.
    pub(super) async fn may_adopt(&self, group: &str, member: (&str, i32)) -> bool {
        let (member_id, generation) = member;
        // (Only a request that may be taken in asks the broker for its groups.)
        if member_id.is_empty() || generation < 1 || self.state.groups.knows(group) {
            return true;
        }
        let now = Instant::now();
        let since = now.checked_sub(ADOPTION_LOOK_AGE).unwrap_or(now);
        matches!(self.has_native_members_since(group, since).await, Ok(false))
    }

    /// Whether a group of the broker named `group` has members that joined natively, on any
    /// topic, as a look at the broker made since this call found it.
    async fn has_native_members(&self, group: &str) -> Result<bool, ErrorReply> {
        self.has_native_members_since(group, Instant::now()).await
    }

    /// Whether a group of the broker named `group` has members that joined natively, on any
    /// topic, as a look at the broker made at `since` or later found it.
    async fn has_native_members_since(
        &self,
        group: &str,
        since: Instant,
    ) -> Result<bool, ErrorReply> {
        let look = || async {
            Ok::<_, ErrorReply>(
                self.describe(None)
                    .await?
                    .into_iter()
                    .flat_map(|topic| topic.groups)
                    .filter(|described| !described.members.is_empty())
                    .map(|described| described.name)
                    .collect(),
            )
        };
        let native = self.state.native_groups.seen_since(since, look).await?;
        Ok(native.contains(group))
    }

    pub(super) async fn sync_group(&self, request: SyncGroupRequest) -> SyncGroupResponse {
        let assignments = request
            .assignments
            .into_iter()
            .map(|assignment| {
                (
                    assignment.member_id.as_str().to_owned(),
                    // Copied, as a joining member's metadata.
                    Bytes::copy_from_slice(&assignment.assignment),
                )
            })
            .collect();
        let synced = self
            .state
            .groups
            .sync(
                request.group_id.as_str(),
                request.member_id.as_str(),
                request.generation_id,
                assignments,
            )
            .await;
        match synced {
            Ok(assignment) => SyncGroupResponse::default().with_assignment(assignment),
            Err(error) => SyncGroupResponse::default().with_error_code(error.code()),
        }
    }

    pub(super) fn leave_group(&self, request: &LeaveGroupRequest) -> LeaveGroupResponse {
        // Up to version 2 one member leaves; from version 3 a batch of them.
        let leaving: Vec<String> = if request.members.is_empty() {
            vec![request.member_id.as_str().to_owned()]
        } else {
            request
                .members
                .iter()
                .map(|member| member.member_id.as_str().to_owned())
                .collect()
        };
        let answers = self.state.groups.leave(request.group_id.as_str(), &leaving);
        let first_error = answers.iter().find_map(|answer| answer.err());
        LeaveGroupResponse::default()
            .with_error_code(code(if request.members.is_empty() {
                first_error
            } else {
                None
            }))
            .with_members(
                request
                    .members
                    .iter()
                    .zip(&answers)
                    .map(|(member, answer)| {
                        MemberResponse::default()
                            .with_member_id(member.member_id.clone())
                            .with_error_code(code(answer.err()))
                    })
                    .collect(),
            )
    }

    /// The names of the broker's groups that have no members of their own: groups Kafka's
    /// clients committed offsets for (or native groups all of whose members left), which Kafka
    /// shows as `Empty` groups.
    async fn memberless_groups(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .describe(None)
            .await
            .unwrap_or_default()
            .iter()
            .flat_map(|topic| &topic.groups)
            .filter(|group| group.members.is_empty())
            .map(|group| group.name.clone())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    pub(super) async fn describe_groups(
        &self,
        request: &DescribeGroupsRequest,
    ) -> DescribeGroupsResponse {
        let memberless = self.memberless_groups().await;
        // Each group once: a request repeating a large group's id must not make the answer as
        // many times larger.
        let mut seen = std::collections::HashSet::new();
        DescribeGroupsResponse::default().with_groups(
            request
                .groups
                .iter()
                .filter(|group| seen.insert(group.as_str()))
                .map(|group| {
                    let mut described = self.state.groups.describe(group.as_str());
                    if described.state == DEAD
                        && memberless.iter().any(|name| name == group.as_str())
                    {
                        described.state = EMPTY;
                        described.protocol_type = CONSUMER_PROTOCOL.to_owned();
                    }
                    DescribedGroup::default()
                        .with_group_id(group.clone())
                        .with_group_state(StrBytes::from_static_str(described.state))
                        .with_protocol_type(StrBytes::from_string(described.protocol_type))
                        .with_protocol_data(StrBytes::from_string(described.protocol))
                        .with_members(
                            described
                                .members
                                .into_iter()
                                .map(|(id, client_id, host, metadata, assignment)| {
                                    DescribedGroupMember::default()
                                        .with_member_id(StrBytes::from_string(id))
                                        .with_client_id(StrBytes::from_string(client_id))
                                        .with_client_host(StrBytes::from_string(host))
                                        .with_member_metadata(metadata)
                                        .with_member_assignment(assignment)
                                })
                                .collect(),
                        )
                })
                .collect(),
        )
    }

    /// Every group, with members or with committed offsets, in the states asked for (every
    /// state when none is).
    pub(super) async fn list_groups(&self, request: &ListGroupsRequest) -> ListGroupsResponse {
        let mut listed = self.state.groups.list();
        for name in self.memberless_groups().await {
            if !listed.iter().any(|(group, _, _)| *group == name) {
                listed.push((name, CONSUMER_PROTOCOL.to_owned(), EMPTY));
            }
        }
        let wanted = &request.states_filter;
        listed.retain(|(_, _, state)| {
            wanted.is_empty() || wanted.iter().any(|asked| asked.eq_ignore_ascii_case(state))
        });
        listed.sort();
        ListGroupsResponse::default().with_groups(
            listed
                .into_iter()
                .map(|(group, protocol_type, state)| {
                    ListedGroup::default()
                        .with_group_id(GroupId(StrBytes::from_string(group)))
                        .with_protocol_type(StrBytes::from_string(protocol_type))
                        .with_group_state(StrBytes::from_static_str(state))
                })
                .collect(),
        )
    }

    /// Deletes groups as `broker group delete` does, on every topic where they committed
    /// offsets. As Kafka answers: a group with members (joined through Kafka or natively) is
    /// `NON_EMPTY_GROUP`, one the broker holds on no topic `GROUP_ID_NOT_FOUND`. (A group whose
    /// stored offsets OffsetDelete removed from some partitions is still held on its topic, as
    /// Kafka keeps an empty group until its metadata expires: it is deleted, not refused.)
    pub(super) async fn delete_groups(&self, request: DeleteGroupsRequest) -> DeleteGroupsResponse {
        let described = self.describe(None).await;
        let mut results = Vec::with_capacity(request.groups_names.len());
        // Each group deleted once, however many times the request names it.
        let mut done: BTreeMap<String, Option<ResponseError>> = BTreeMap::new();
        for group in request.groups_names {
            let error = match (done.get(group.as_str()), &described) {
                (Some(error), _) => *error,
                (None, Ok(topics)) => {
                    let error = self.delete_group(group.as_str(), topics).await;
                    if error.is_none() {
                        // Deleted: not listed as an empty group of Kafka's clients any more.
                        self.state.groups.deleted(group.as_str());
                    }
                    error
                }
                (None, Err(refusal)) => Some(coordinator_error(refusal)),
            };
            done.insert(group.as_str().to_owned(), error);
            results.push(
                DeletableGroupResult::default()
                    .with_group_id(group)
                    .with_error_code(code(error)),
            );
        }
        DeleteGroupsResponse::default().with_results(results)
    }

    /// Deletes `group` from each of `topics` that has it; why not, if it cannot.
    async fn delete_group(
        &self,
        group: &str,
        topics: &[TopicDescription],
    ) -> Option<ResponseError> {
        if !self.is_group_id(group) {
            return Some(ResponseError::InvalidGroupId);
        }
        // No member joins until the group is deleted, so the group checked empty here is
        // still empty when its offsets go.
        let _turn = self.state.groups.turn(group).await;
        if self.state.groups.has_members(group) {
            return Some(ResponseError::NonEmptyGroup);
        }
        let holding: Vec<(&str, bool)> = topics
            .iter()
            .filter_map(|topic| {
                let described = topic
                    .groups
                    .iter()
                    .find(|described| described.name == group)?;
                Some((topic.name.as_str(), !described.members.is_empty()))
            })
            .collect();
        if holding.is_empty() {
            return Some(ResponseError::GroupIdNotFound);
        }
        if holding.iter().any(|&(_, has_members)| has_members) {
            return Some(ResponseError::NonEmptyGroup);
        }
        for (topic, _) in holding {
            let command = Command::DeleteGroup {
                topic: topic.to_owned(),
                group: group.to_owned(),
            };
            match self.call(command).await {
                Ok(Outcome::Deleted(_)) => {}
                // Members joined meanwhile, or the topic is gone (deleted meanwhile).
                Err(ErrorReply::InvalidArgument(_)) => {
                    if self.has_native_members(group).await.unwrap_or(true) {
                        return Some(ResponseError::NonEmptyGroup);
                    }
                }
                Ok(other) => return Some(coordinator_error(&unexpected(&other))),
                Err(refusal) => return Some(coordinator_error(&refusal)),
            }
        }
        None
    }
}
