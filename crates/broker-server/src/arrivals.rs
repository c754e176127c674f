//! Connections that hold a connection slot but have not said who they are yet: a connection of
//! the broker's port before its hello is welcomed (its TLS handshake included), a Kafka
//! connection before its first request that reaches the broker (past `ApiVersions` and
//! authentication, which the Kafka listener answers itself). While every slot is taken, the
//! next connection to arrive displaces the oldest of them (`intake::next_connection`), so that
//! clients that connect and say nothing (or only say hello slowly) cannot keep the others out;
//! a client that says hello at once is never the oldest for long.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio_util::sync::CancellationToken;
use tracing::debug;

/// The connections arriving, by connection id (ids grow: the first is the oldest), each with
/// the token that closes it.
#[derive(Debug, Default, Clone)]
pub(crate) struct Arrivals {
    arriving: Arc<Mutex<BTreeMap<u64, CancellationToken>>>,
}

impl Arrivals {
    /// Notes connection `id` as arriving until the guard returned is dropped (or
    /// [`Arriving::arrived`]); displacing it cancels `closing`, which must close it.
    pub(crate) fn arriving(&self, id: u64, closing: CancellationToken) -> Arriving {
        self.lock().insert(id, closing);
        Arriving {
            arrivals: self.clone(),
            id,
        }
    }

    /// Closes the oldest connection arriving, if there is one; whether there was.
    pub(crate) fn displace_oldest(&self) -> bool {
        let oldest = self.lock().pop_first();
        match oldest {
            Some((id, closing)) => {
                debug!(
                    connection = id,
                    "closing a connection that has not said hello, for a new one"
                );
                closing.cancel();
                true
            }
            None => false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, CancellationToken>> {
        self.arriving.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A connection noted as arriving (see [`Arrivals::arriving`]), until dropped.
#[derive(Debug)]
pub(crate) struct Arriving {
    arrivals: Arrivals,
    id: u64,
}

impl Arriving {
    /// The connection said who it is: it is no longer displaced for a new one. `false` if it
    /// was displaced meanwhile (its closing token is cancelled): it must close, since the
    /// connection that displaced it waits for its slot.
    pub(crate) fn arrived(self) -> bool {
        // (Dropped after: removing it again removes nothing.)
        self.arrivals.lock().remove(&self.id).is_some()
    }
}

impl Drop for Arriving {
    fn drop(&mut self) {
        self.arrivals.lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_arriving_connection_is_displaced_and_one_that_arrived_never_is() {
        let arrivals = Arrivals::default();
        let (first, second, third) = (
            CancellationToken::new(),
            CancellationToken::new(),
            CancellationToken::new(),
        );
        let one = arrivals.arriving(1, first.clone());
        let two = arrivals.arriving(2, second.clone());
        let three = arrivals.arriving(3, third.clone());
        assert!(one.arrived());
        assert!(arrivals.displace_oldest());
        assert!(second.is_cancelled() && !first.is_cancelled() && !third.is_cancelled());
        // Displaced: it must close.
        assert!(!two.arrived());
        drop(three);
        assert!(arrivals.lock().is_empty());
        assert!(!arrivals.displace_oldest());
    }
}
