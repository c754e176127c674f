//! How large an answer that carries records may grow, and the room it takes in the process's
//! request memory while it is built and written.
//!
//! A read, poll or fetch is a few dozen bytes that can ask for megabytes of records, and a
//! native client may pipeline a thousand of them without reading the answers. So before such a
//! request is applied, it takes room for its answer from the request memory (the budget that
//! frames take from, `--max-request-memory`): as much as its byte budget and the frame limit
//! allow, or what is free once at least the least an answer needs is (the overhead of as many
//! records as it asks for, and one record of the largest payload), waiting for that much as a
//! frame waits for room to be read. Its byte budget is lowered to the room it got; once the
//! answer is built, the room shrinks to what it takes, and it is given back when the answer is
//! written. A request that finds no record and waits for one holds no room while it waits:
//! each retry takes room anew, from the byte budget the request came with.
//!
//! Answers that list the whole state (see [`grows_with_state`]) have no byte budget to lower
//! and take no room: a connection has one of them at a time on its way instead.

use broker_core::{
    BrokerRecord, Command, Outcome, PartitionRead, HEADER_WIRE_BYTES, MAX_FETCH_RECORDS,
    MAX_IDENTIFIER_LEN, MAX_KAFKA_NAME_LEN,
};
use broker_net::{FrameRoom, RequestMemory};
use broker_proto::{Decoded, ErrorReply, RequestFrame};

use crate::Config;

/// Wire bytes a record may take in a response beyond its payload, key and topic name.
pub(crate) const RECORD_OVERHEAD: usize = 120;

/// Wire bytes a records response may take besides its records.
pub(crate) const RESPONSE_OVERHEAD: usize = 1024;

/// Lowers the byte budget of `command`'s answer, when it carries records, so that the answer
/// fits in `room` bytes: its records, their wire overhead and the response's. (The first
/// record comes whatever its size: the room taken for an answer allows for one.)
pub(crate) fn fit_answer(command: &mut Command, room: u64) {
    if let Some(budget) = command.answer_budget() {
        let fits = room.saturating_sub(overhead(budget.topic, budget.max_records));
        *budget.max_bytes = Some(budget.max_bytes.map_or(fits, |asked| asked.min(fits)));
    }
}

/// The wire bytes an answer of up to `max_records` records of `topic` takes besides their
/// payloads, keys and headers (whose lengths the core's byte budget counts, see
/// [`HEADER_WIRE_BYTES`]). Counted for no more records than any request may ask for, and
/// no longer a name than any topic has: a request asking for more is refused once applied,
/// and must not first take room it could never use.
fn overhead(topic: &str, max_records: i32) -> u64 {
    let records = u64::try_from(max_records.min(MAX_FETCH_RECORDS)).unwrap_or(0);
    let topic = topic.len().min(MAX_KAFKA_NAME_LEN.max(MAX_IDENTIFIER_LEN));
    records
        .saturating_mul((RECORD_OVERHEAD + topic) as u64)
        .saturating_add(RESPONSE_OVERHEAD as u64)
}

/// The room `command`'s answer may take, when it carries records: what its byte budget and
/// the frame limit allow, and the least it needs, the overhead of as many records as it asks
/// for and one record of the largest payload (the first record comes whatever its size, and
/// the budget left beside that overhead is never less than one payload). Neither is more than
/// a frame (no answer is larger), nor more than the request memory (the connection's share of
/// it) leaves beside the `held` bytes the request's own frame holds: the least must be free
/// some day, or the request, and every request after it, would wait for ever.
fn answer_wants(
    config: &Config,
    memory: &RequestMemory,
    held: u64,
    command: &mut Command,
) -> Option<(u64, u64)> {
    let budget = command.answer_budget()?;
    let overhead = overhead(budget.topic, budget.max_records);
    let payloads = (*budget.max_bytes).unwrap_or(config.max_frame_bytes as u64);
    let most = (config.max_frame_bytes as u64).min(memory.most_held().saturating_sub(held));
    let least = overhead
        .saturating_add(config.max_payload_bytes as u64)
        .min(most);
    let wanted = overhead
        .saturating_add(payloads)
        .min(config.max_frame_bytes as u64)
        .max(least)
        .min(most);
    Some((wanted, least))
}

/// Takes room in `memory` for the answer of `frame`, when it carries records, waiting until
/// the least it needs is free; `held` is the room the frame itself holds. The request's byte
/// budget is lowered to it once the request is admitted (see [`fit_answer`]).
pub(crate) async fn room_for(
    config: &Config,
    memory: &RequestMemory,
    held: u64,
    frame: &mut Decoded<RequestFrame>,
) -> Option<FrameRoom> {
    let (wanted, least) = answer_wants(config, memory, held, command_of(frame)?)?;
    Some(memory.answer_room(wanted, least).await)
}

/// [`room_for`] without waiting: `Err` when the least the answer needs is not free now;
/// `Ok(None)` for a request whose answer carries no records.
pub(crate) fn room_now_for(
    config: &Config,
    memory: &RequestMemory,
    held: u64,
    frame: &mut Decoded<RequestFrame>,
) -> Result<Option<FrameRoom>, NoRoom> {
    let Some((wanted, least)) =
        command_of(frame).and_then(|c| answer_wants(config, memory, held, c))
    else {
        return Ok(None);
    };
    memory
        .try_answer_room(wanted, least)
        .map(Some)
        .ok_or(NoRoom)
}

/// The least room an answer needs is not free now.
#[derive(Debug)]
pub(crate) struct NoRoom;

/// For a retry of a waiting request (whose frame holds `held` bytes of room): room for its
/// answer, waiting until the least it needs is free, its byte budget lowered to it.
pub(crate) async fn room_for_retry(
    config: &Config,
    memory: &RequestMemory,
    held: u64,
    command: &mut Command,
) -> Option<FrameRoom> {
    let (wanted, least) = answer_wants(config, memory, held, command)?;
    let room = memory.answer_room(wanted, least).await;
    fit_answer(command, room.bytes());
    Some(room)
}

/// Whether `frame`'s answer grows with the state
/// ([`broker_core::CommandKind::answer_grows_with_state`]): a connection has one such answer
/// at a time on its way.
pub(crate) fn grows_with_state(frame: &Decoded<RequestFrame>) -> bool {
    match frame {
        Decoded::Message(request) => request.command.kind().answer_grows_with_state(),
        Decoded::Malformed { .. } => false,
    }
}

fn command_of(frame: &mut Decoded<RequestFrame>) -> Option<&mut Command> {
    match frame {
        Decoded::Message(request) => Some(&mut request.command),
        Decoded::Malformed { .. } => None,
    }
}

/// The wire bytes an answer with `result` takes, near enough: its records with their
/// overhead, and the response's.
pub(crate) fn answer_bytes(result: &Result<Outcome, ErrorReply>) -> u64 {
    let records: &[BrokerRecord] = match result {
        Ok(
            Outcome::Records(records)
            | Outcome::Read(PartitionRead { records, .. })
            | Outcome::AckedAndPolled { records, .. },
        ) => records,
        _ => &[],
    };
    let bytes: usize = records
        .iter()
        .map(|record| {
            // What each header takes on the wire: its name and value, and their lengths.
            let headers: usize = record
                .headers
                .iter()
                .map(|header| {
                    HEADER_WIRE_BYTES as usize
                        + header.name.len()
                        + header.value.as_ref().map_or(0, |v| v.len())
                })
                .sum();
            RECORD_OVERHEAD
                + record.topic.len()
                + record.payload.len()
                + record.key.as_ref().map_or(0, |key| key.len())
                + headers
        })
        .sum();
    (RESPONSE_OVERHEAD + bytes) as u64
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use broker_core::Command;
    use bytes::Bytes;

    use super::*;

    fn poll(max_bytes: Option<u64>) -> Command {
        Command::Poll {
            topic: "topic".into(),
            group: "g".into(),
            member: "m".into(),
            max_records: 10,
            max_bytes,
        }
    }

    fn budget(command: &Command) -> Option<u64> {
        match command {
            Command::Poll { max_bytes, .. } => *max_bytes,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[tokio::test]
    async fn an_answer_never_waits_for_more_than_its_connections_share_leaves() {
        // A share of 8 MiB, of which the request's own frame holds 7.5 MiB: the least its
        // answer needs (overhead and a record of 1 MiB) would never be free in it.
        let memory = RequestMemory::new(32 << 20).for_connection(8 << 20);
        let frame_room = memory.room((15 << 20) / 2).await;
        let mut frame = Decoded::Message(RequestFrame {
            correlation_id: 1,
            max_wait_ms: 0,
            command: poll(None),
        });
        let room = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            room_for(&Config::default(), &memory, frame_room.bytes(), &mut frame),
        )
        .await
        .expect("an answer waited for room its connection can never have")
        .unwrap();
        assert_eq!(room.bytes(), (8 << 20) - frame_room.bytes());
    }

    #[tokio::test]
    async fn an_answer_takes_room_for_what_it_asks_and_never_less_than_one_record() {
        let config = Config {
            max_payload_bytes: 10_000,
            max_frame_bytes: 1 << 20,
            ..Config::default()
        };
        let overhead = (RESPONSE_OVERHEAD + 10 * (RECORD_OVERHEAD + 5)) as u64;
        let memory = RequestMemory::new(1 << 20);
        let frame = |max_bytes| {
            Decoded::Message(RequestFrame {
                correlation_id: 1,
                max_wait_ms: 0,
                command: poll(max_bytes),
            })
        };
        // Asked for 50,000 bytes: room for them and the answer's overhead.
        let room = room_for(&config, &memory, 0, &mut frame(Some(50_000)))
            .await
            .unwrap();
        assert_eq!(room.bytes(), (50_000 + overhead).div_ceil(64) * 64);
        // Asked for none: still room for one record of the largest payload, which comes
        // whatever the budget.
        let small = room_for(&config, &memory, 0, &mut frame(Some(0)))
            .await
            .unwrap();
        assert_eq!(small.bytes(), (10_000 + overhead).div_ceil(64) * 64);
        let mut command = poll(Some(0));
        fit_answer(&mut command, small.bytes());
        assert_eq!(budget(&command), Some(0), "the client's budget stays");
        // Only 20,000 bytes left: one asking for no limit gets them, its budget lowered.
        let held = room.bytes() + small.bytes();
        let _held = memory.room((1 << 20) - 20_000 - held as usize).await;
        let mut command = poll(None);
        let free = room_for_retry(&config, &memory, 0, &mut command)
            .await
            .unwrap();
        assert_eq!(free.bytes(), 19_968);
        assert_eq!(budget(&command), Some(19_968 - overhead));
        // Less free than the least an answer needs: a new request cannot have it now.
        assert!(room_now_for(&config, &memory, 0, &mut frame(None)).is_err());
        // A command whose answer carries no records takes no room.
        let mut publish = Decoded::Message(RequestFrame {
            correlation_id: 3,
            max_wait_ms: 0,
            command: Command::Publish {
                topic: "t".into(),
                partition: 0,
                payload: Bytes::from_static(b"x"),
            },
        });
        assert!(room_now_for(&config, &memory, 0, &mut publish)
            .unwrap()
            .is_none());
    }
}
