//! Changing a topic's configs: AlterConfigs and IncrementalAlterConfigs, both as the broker's
//! `ConfigureTopic` of the settings the configs name (`configs::changed_settings`).
//!
//! Both change only the configs they name: Kafka's AlterConfigs would also reset the configs it
//! does not name to their defaults, which for the broker would remove limits, which it cannot
//! do. IncrementalAlterConfigs sets (SET); DELETE, APPEND and SUBTRACT are refused per resource.

use std::collections::HashMap;

use broker_core::{Command, Outcome, TopicSetting, TopicSettings};
use broker_proto::ErrorReply;
use kafka_protocol::messages::{
    alter_configs_response, incremental_alter_configs_response, AlterConfigsRequest,
    AlterConfigsResponse, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::configs::{self, BROKER, OP_DELETE, OP_SET, TOPIC};
use crate::errors::kafka_error;
use crate::Backend;

use super::{message, unexpected, Handler};

/// Why a resource's change was refused: the error and its message.
type Refusal = (ResponseError, String);

/// One resource of either request: its type and name, and each config's name, operation
/// (AlterConfigs only sets) and value.
struct Change {
    resource_type: i8,
    name: StrBytes,
    configs: Vec<(StrBytes, i8, Option<StrBytes>)>,
}

/// What a resource is answered: its type and name, the error code (0: changed) and message.
struct Changed {
    resource_type: i8,
    name: StrBytes,
    code: i16,
    message: Option<StrBytes>,
}

impl<B: Backend> Handler<'_, B> {
    /// Changes the topics' configs each resource names (only those it names).
    pub(super) async fn alter_configs(&self, request: AlterConfigsRequest) -> AlterConfigsResponse {
        let changes = request.resources.into_iter().map(|resource| Change {
            resource_type: resource.resource_type,
            name: resource.resource_name,
            configs: resource
                .configs
                .into_iter()
                .map(|config| (config.name, OP_SET, config.value))
                .collect(),
        });
        let responses = self.change_all(changes, request.validate_only).await;
        AlterConfigsResponse::default().with_responses(
            responses
                .into_iter()
                .map(|changed| {
                    alter_configs_response::AlterConfigsResourceResponse::default()
                        .with_resource_type(changed.resource_type)
                        .with_resource_name(changed.name)
                        .with_error_code(changed.code)
                        .with_error_message(changed.message)
                })
                .collect(),
        )
    }

    /// Changes the topics' configs each resource sets; a resource that deletes a config (or
    /// appends to or subtracts from one) is refused whole with `INVALID_CONFIG`.
    pub(super) async fn incremental_alter_configs(
        &self,
        request: IncrementalAlterConfigsRequest,
    ) -> IncrementalAlterConfigsResponse {
        let changes = request.resources.into_iter().map(|resource| Change {
            resource_type: resource.resource_type,
            name: resource.resource_name,
            configs: resource
                .configs
                .into_iter()
                .map(|config| (config.name, config.config_operation, config.value))
                .collect(),
        });
        let responses = self.change_all(changes, request.validate_only).await;
        IncrementalAlterConfigsResponse::default().with_responses(
            responses
                .into_iter()
                .map(|changed| {
                    incremental_alter_configs_response::AlterConfigsResourceResponse::default()
                        .with_resource_type(changed.resource_type)
                        .with_resource_name(changed.name)
                        .with_error_code(changed.code)
                        .with_error_message(changed.message)
                })
                .collect(),
        )
    }

    /// Makes each change (or, with `validate_only`, checks it), one after another (two of one
    /// topic apply in order); answers each. A topic named many times is described once (and
    /// again only after a change of it).
    async fn change_all(
        &self,
        changes: impl Iterator<Item = Change>,
        validate_only: bool,
    ) -> Vec<Changed> {
        let mut current = HashMap::new();
        let mut answers = Vec::new();
        for change in changes {
            let refused_operation = change.configs.iter().find_map(|(name, operation, _)| {
                let name = name.as_str();
                match *operation {
                    OP_SET => None,
                    OP_DELETE => Some(configs::cannot_remove(name)),
                    operation => Some(format!(
                        "operation {operation} on {name} is not supported: only SET (0) \
                         changes a topic's configs (APPEND and SUBTRACT are for list configs, \
                         which the broker has none of that can change)"
                    )),
                }
            });
            let settings = match refused_operation {
                Some(text) => Err(text),
                None => {
                    configs::changed_settings(change.configs.iter().map(|(name, _, value)| {
                        (name.as_str(), value.as_ref().map(StrBytes::as_str))
                    }))
                }
            };
            let result = self
                .change_resource(
                    change.resource_type,
                    change.name.as_str(),
                    settings,
                    validate_only,
                    &mut current,
                )
                .await;
            let (code, message) = match result {
                Ok(()) => (0, None),
                Err((error, text)) => (error.code(), message(text)),
            };
            answers.push(Changed {
                resource_type: change.resource_type,
                name: change.name,
                code,
                message,
            });
        }
        answers
    }

    /// Changes one resource's configs to `settings` (or refuses them: `INVALID_CONFIG` with
    /// the reason), checked against the topic's settings first, and with `validate_only`
    /// only checked. A broker resource, or any other than a topic, is refused. `current`
    /// holds the settings of the topics described so far (`None`: no such topic), and takes
    /// the new ones.
    async fn change_resource(
        &self,
        resource_type: i8,
        name: &str,
        settings: Result<Vec<TopicSetting>, String>,
        validate_only: bool,
        current: &mut HashMap<String, Option<Vec<TopicSetting>>>,
    ) -> Result<(), Refusal> {
        match resource_type {
            TOPIC => {}
            BROKER => {
                return Err((
                    ResponseError::InvalidRequest,
                    "a broker's configs cannot change through Kafka: they are the \
                     broker-server's command-line flags"
                        .to_owned(),
                ))
            }
            other => {
                return Err((
                    ResponseError::InvalidRequest,
                    format!("configs of resource type {other} are not kept by this broker"),
                ))
            }
        }
        let settings = settings.map_err(|text| (ResponseError::InvalidConfig, text))?;
        if !current.contains_key(name) {
            let described = match self.describe(Some(name.to_owned())).await {
                Ok(described) => described
                    .into_iter()
                    .find(|topic| topic.name == name)
                    .map(|topic| topic.settings),
                Err(ErrorReply::InvalidArgument(_)) => None,
                Err(refusal) => return Err((kafka_error(&refusal), refusal.to_string())),
            };
            current.insert(name.to_owned(), described);
        }
        let Some(Some(now)) = current.get(name) else {
            return Err((
                ResponseError::UnknownTopicOrPartition,
                format!("topic {name:?} does not exist"),
            ));
        };
        // What the broker would refuse, refused before anything changes (and all that a
        // validation does).
        TopicSettings::from_list(now)
            .and_then(|now| now.changed(&settings))
            .map_err(|error| (ResponseError::InvalidConfig, error.to_string()))?;
        if validate_only {
            return Ok(());
        }
        let command = Command::ConfigureTopic {
            topic: name.to_owned(),
            settings,
        };
        match self.call(command).await {
            Ok(Outcome::TopicSettings(changed)) => {
                current.insert(name.to_owned(), Some(changed));
                Ok(())
            }
            Ok(other) => {
                let refusal = unexpected(&other);
                Err((kafka_error(&refusal), refusal.to_string()))
            }
            // The topic deleted, or changed, meanwhile.
            Err(ErrorReply::InvalidArgument(text)) => Err((ResponseError::InvalidConfig, text)),
            Err(refusal) => Err((kafka_error(&refusal), refusal.to_string())),
        }
    }
}
