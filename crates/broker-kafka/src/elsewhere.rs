//! The answers of a node that does not coordinate groups now (a node of a cluster that does
//! not lead): every group request is refused with the error Kafka's clients take as "find the
//! coordinator again", and the list of groups this node coordinates is empty.

use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::DescribedGroup;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use kafka_protocol::messages::{
    DeleteGroupsResponse, DescribeGroupsResponse, HeartbeatResponse, JoinGroupResponse,
    LeaveGroupResponse, ListGroupsResponse, OffsetCommitResponse, OffsetDeleteResponse,
    OffsetFetchResponse, RequestKind, ResponseKind, SyncGroupResponse,
};
use kafka_protocol::ResponseError;

/// `request` refused with `error` (`NOT_COORDINATOR`) if it is a request of a group's
/// coordinator; `None` for a request of any other API.
pub(crate) fn refuse_group_request(
    request: &RequestKind,
    error: ResponseError,
) -> Option<ResponseKind> {
    let code = error.code();
    Some(match request {
        RequestKind::JoinGroup(request) => ResponseKind::JoinGroup(
            JoinGroupResponse::default()
                .with_error_code(code)
                .with_generation_id(-1)
                .with_member_id(request.member_id.clone()),
        ),
        RequestKind::SyncGroup(_) => {
            ResponseKind::SyncGroup(SyncGroupResponse::default().with_error_code(code))
        }
        RequestKind::Heartbeat(_) => {
            ResponseKind::Heartbeat(HeartbeatResponse::default().with_error_code(code))
        }
        RequestKind::LeaveGroup(_) => {
            ResponseKind::LeaveGroup(LeaveGroupResponse::default().with_error_code(code))
        }
        RequestKind::OffsetCommit(request) => ResponseKind::OffsetCommit(
            OffsetCommitResponse::default().with_topics(
                request
                    .topics
                    .iter()
                    .map(|topic| {
                        OffsetCommitResponseTopic::default()
                            .with_name(topic.name.clone())
                            .with_partitions(
                                topic
                                    .partitions
                                    .iter()
                                    .map(|partition| {
                                        OffsetCommitResponsePartition::default()
                                            .with_partition_index(partition.partition_index)
                                            .with_error_code(code)
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            ),
        ),
        RequestKind::OffsetFetch(request) => {
            ResponseKind::OffsetFetch(offset_fetch_refused(request, code))
        }
        RequestKind::DescribeGroups(request) => ResponseKind::DescribeGroups(
            DescribeGroupsResponse::default().with_groups(
                request
                    .groups
                    .iter()
                    .map(|group| {
                        DescribedGroup::default()
                            .with_group_id(group.clone())
                            .with_error_code(code)
                    })
                    .collect(),
            ),
        ),
        RequestKind::DeleteGroups(request) => ResponseKind::DeleteGroups(
            DeleteGroupsResponse::default().with_results(
                request
                    .groups_names
                    .iter()
                    .map(|group| {
                        DeletableGroupResult::default()
                            .with_group_id(group.clone())
                            .with_error_code(code)
                    })
                    .collect(),
            ),
        ),
        RequestKind::OffsetDelete(_) => {
            ResponseKind::OffsetDelete(OffsetDeleteResponse::default().with_error_code(code))
        }
        // Each node lists the groups it coordinates: none.
        RequestKind::ListGroups(_) => ResponseKind::ListGroups(ListGroupsResponse::default()),
        _ => return None,
    })
}

/// `request` refused with `code`: as the error of the whole answer and, since version 1 has
/// none (only each partition's), on every partition asked for.
pub(crate) fn offset_fetch_refused(
    request: &kafka_protocol::messages::OffsetFetchRequest,
    code: i16,
) -> OffsetFetchResponse {
    OffsetFetchResponse::default()
        .with_error_code(code)
        .with_topics(
            request
                .topics
                .iter()
                .flatten()
                .map(|topic| {
                    OffsetFetchResponseTopic::default()
                        .with_name(topic.name.clone())
                        .with_partitions(
                            topic
                                .partition_indexes
                                .iter()
                                .map(|&partition| {
                                    OffsetFetchResponsePartition::default()
                                        .with_partition_index(partition)
                                        .with_committed_offset(-1)
                                        .with_error_code(code)
                                })
                                .collect(),
                        )
                })
                .collect(),
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::{HeartbeatRequest, MetadataRequest, ProduceRequest};

    #[test]
    fn group_requests_are_refused_and_others_pass() {
        let refused = refuse_group_request(
            &RequestKind::Heartbeat(HeartbeatRequest::default()),
            ResponseError::NotCoordinator,
        );
        assert!(matches!(
            refused,
            Some(ResponseKind::Heartbeat(response))
                if response.error_code == ResponseError::NotCoordinator.code()
        ));
        for other in [
            RequestKind::Metadata(MetadataRequest::default()),
            RequestKind::Produce(ProduceRequest::default()),
        ] {
            assert!(refuse_group_request(&other, ResponseError::NotCoordinator).is_none());
        }
    }
}
