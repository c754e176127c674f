//! How a connection sizes the buffers it reads into and encodes into: room for a chunk before
//! each read, and a buffer that grew for one large frame released once it is empty, so an idle
//! connection does not keep a maximum-size frame's worth of memory.

use bytes::BytesMut;

/// Bytes a read asks for when the buffer is short of room.
pub const READ_CHUNK: usize = 64 * 1024;

/// A buffer that grew past this (for one large frame) is released once it is empty.
pub const KEEP_BUFFER_BYTES: usize = 1024 * 1024;

/// Prepares `buffer` for the next read: a grown, empty buffer is replaced by a small one, and
/// one with less than a quarter chunk free gets room for a whole chunk.
pub fn make_room(buffer: &mut BytesMut) {
    release_if_grown(buffer);
    if buffer.capacity() - buffer.len() < READ_CHUNK / 4 {
        buffer.reserve(READ_CHUNK);
    }
}

/// Replaces `buffer` by a small one if it is empty and grew past [`KEEP_BUFFER_BYTES`].
pub fn release_if_grown(buffer: &mut BytesMut) {
    if buffer.is_empty() && buffer.capacity() > KEEP_BUFFER_BYTES {
        *buffer = BytesMut::with_capacity(READ_CHUNK);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grown_buffer_is_released_only_when_empty() {
        let mut buffer = BytesMut::with_capacity(4 * KEEP_BUFFER_BYTES);
        buffer.extend_from_slice(b"partial frame");
        make_room(&mut buffer);
        assert!(
            buffer.capacity() >= 4 * KEEP_BUFFER_BYTES,
            "released with data in it"
        );
        buffer.clear();
        make_room(&mut buffer);
        assert!(buffer.capacity() < KEEP_BUFFER_BYTES);
        assert!(buffer.capacity() >= READ_CHUNK / 4);
    }

    #[test]
    fn a_full_buffer_gets_a_chunk_of_room() {
        let mut buffer = BytesMut::new();
        make_room(&mut buffer);
        assert!(buffer.capacity() - buffer.len() >= READ_CHUNK);
    }
}
