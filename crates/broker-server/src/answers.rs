//! How large an answer that carries records may grow, and the room it takes in the process's
//! request memory while it is built and written.
//!
//! A read, poll or fetch is a few dozen bytes that can ask for megabytes of records, and a
//! native client may pipeline a thousand of them without reading the answers. So before such a
//! request is applied, it takes room for its answer from the request memory (the budget that
//! frames take from, `--max-request-memory`): as much of what its byte budget asks for as is
//! free, once at least room for its first record is (waiting for that much, as a frame waits
//! for room to be read). Its byte budget is lowered to the room it got; once the answer is
//! built, the room shrinks to what it takes, and it is given back when the answer is written.
//! A request that finds no record and waits for one holds no room while it waits: each retry
//! takes what is free then.

use broker_core::{BrokerRecord, Command, Outcome, PartitionRead};
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
        let records = u64::try_from(budget.max_records).unwrap_or(0);
        let per_record = (RECORD_OVERHEAD + budget.topic.len()) as u64;
        let overhead = records
            .saturating_mul(per_record)
            .saturating_add(RESPONSE_OVERHEAD as u64);
        let fits = room.saturating_sub(overhead);
        *budget.max_bytes = Some(budget.max_bytes.map_or(fits, |asked| asked.min(fits)));
    }
}

/// The room `command`'s answer may take, when it carries records: what its byte budget (as
/// [`fit_answer`] set it for a frame) allows, and the least it can make do with, room for its
/// first record at the largest payload.
fn answer_wants(config: &Config, command: &mut Command) -> Option<(u64, u64)> {
    let budget = command.answer_budget()?;
    let records = u64::try_from(budget.max_records).unwrap_or(0);
    let per_record = (RECORD_OVERHEAD + budget.topic.len()) as u64;
    let payloads = (*budget.max_bytes).unwrap_or(config.max_frame_bytes as u64);
    let wanted = records
        .saturating_mul(per_record)
        .saturating_add(payloads)
        .saturating_add(RESPONSE_OVERHEAD as u64)
        .min(config.max_frame_bytes as u64);
    let least = (config.max_payload_bytes + RESPONSE_OVERHEAD) as u64 + per_record;
    Some((wanted, least.min(wanted)))
}

/// Takes room in `memory` for the answer of `frame`, when it carries records, waiting until
/// the least it needs is free, and lowers its byte budget to that room.
pub(crate) async fn room_for(
    config: &Config,
    memory: &RequestMemory,
    frame: &mut Decoded<RequestFrame>,
) -> Option<FrameRoom> {
    let command = command_of(frame)?;
    let (wanted, least) = answer_wants(config, command)?;
    let room = memory.answer_room(wanted, least).await;
    fit_answer(command, room.bytes());
    Some(room)
}

/// [`room_for`] without waiting: `Err` when the least the answer needs is not free now;
/// `Ok(None)` for a request whose answer carries no records.
pub(crate) fn room_now_for(
    config: &Config,
    memory: &RequestMemory,
    frame: &mut Decoded<RequestFrame>,
) -> Result<Option<FrameRoom>, NoRoom> {
    let Some(command) = command_of(frame) else {
        return Ok(None);
    };
    let Some((wanted, least)) = answer_wants(config, command) else {
        return Ok(None);
    };
    let room = memory.try_answer_room(wanted, least).ok_or(NoRoom)?;
    fit_answer(command, room.bytes());
    Ok(Some(room))
}

/// The least room an answer needs is not free now.
#[derive(Debug)]
pub(crate) struct NoRoom;

/// For a retry of a waiting request: whatever room is free now for its answer, up to what it
/// may take, its byte budget lowered to it (to none, when nothing is free: its first record
/// then comes alone).
pub(crate) fn room_free_for(
    config: &Config,
    memory: &RequestMemory,
    command: &mut Command,
) -> Option<FrameRoom> {
    let (wanted, _) = answer_wants(config, command)?;
    let room = memory.try_answer_room(wanted, 1);
    fit_answer(command, room.as_ref().map_or(0, FrameRoom::bytes));
    room
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
            let headers: usize = record
                .headers
                .iter()
                .map(|header| header.name.len() + header.value.as_ref().map_or(0, |v| v.len()))
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
    async fn an_answer_takes_room_for_what_it_asks_and_its_budget_follows_the_room_it_got() {
        let config = Config {
            max_payload_bytes: 10_000,
            max_frame_bytes: 1 << 20,
            ..Config::default()
        };
        let overhead = (RESPONSE_OVERHEAD + 10 * (RECORD_OVERHEAD + 5)) as u64;
        let memory = RequestMemory::new(1 << 20);
        // Asked for 5,000 bytes: room for them and the answer's overhead.
        let mut frame = Decoded::Message(RequestFrame {
            correlation_id: 1,
            max_wait_ms: 0,
            command: poll(Some(5_000)),
        });
        let room = room_for(&config, &memory, &mut frame).await.unwrap();
        assert_eq!(room.bytes(), (5_000 + overhead).div_ceil(64) * 64);
        let Decoded::Message(request) = &frame else {
            unreachable!()
        };
        assert_eq!(budget(&request.command), Some(5_000));
        // Only 20,000 bytes left: one asking for no limit gets them, its budget lowered.
        let _held = memory
            .room((1 << 20) - 20_000 - room.bytes() as usize)
            .await;
        let mut command = poll(None);
        let free = room_free_for(&config, &memory, &mut command).unwrap();
        assert_eq!(free.bytes(), 19_968);
        assert_eq!(budget(&command), Some(19_968 - overhead));
        // Less free than one record may take: a new request cannot have it now, a retry
        // takes none and reads its first record alone.
        let mut frame = Decoded::Message(RequestFrame {
            correlation_id: 2,
            max_wait_ms: 0,
            command: poll(None),
        });
        assert!(room_now_for(&config, &memory, &mut frame).is_err());
        let mut command = poll(None);
        assert!(room_free_for(&config, &memory, &mut command).is_none());
        assert_eq!(budget(&command), Some(0));
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
        assert!(room_now_for(&config, &memory, &mut publish)
            .unwrap()
            .is_none());
    }
}
