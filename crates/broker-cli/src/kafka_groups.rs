//! The consumer groups Kafka's clients joined through the server's Kafka listener, which
//! `broker describe` and `broker top` show beside the broker's groups of the same names.

use broker_client::{Client, Error, ErrorReply, KafkaGroupDescription};

/// The consumer groups Kafka's clients joined through the server's Kafka listener, to show
/// with the broker's groups: none from a server before protocol version 15, which does not
/// know the call.
pub async fn kafka_groups(client: &Client) -> Result<Vec<KafkaGroupDescription>, Error> {
    match client.kafka_groups().await {
        Err(Error::Server(ErrorReply::MalformedRequest(_))) => Ok(Vec::new()),
        answered => answered,
    }
}
