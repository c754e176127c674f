//! Which of the broker's groups have members that joined natively, as a look at the broker
//! found them, shared by every connection: a group name is used by one protocol at a time, so
//! Kafka's group requests ask this before they let a member in, and a look is a description
//! of every topic. Requests that arrive while a look is made wait for it and share it, and a
//! heartbeat or commit may use a look up to [`ADOPTION_LOOK_AGE`] old, so that a client
//! sending requests for made-up group names costs the broker at most a look a second.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// How old a look a heartbeat or commit of a group the coordinator does not hold may use to
/// decide whether it may take the member in (see the groups module). Such requests come from
/// every member of every group once a server restarts or a node takes over; a native member
/// that joined less than this before would not be seen, a window the order of the requests
/// leaves open anyway.
pub(crate) const ADOPTION_LOOK_AGE: Duration = Duration::from_secs(1);

/// The last look at the broker's groups with native members; `E` is why a look failed.
#[derive(Debug)]
pub(crate) struct NativeGroups<E> {
    last: tokio::sync::Mutex<Option<Look<E>>>,
}

impl<E> Default for NativeGroups<E> {
    fn default() -> Self {
        NativeGroups {
            last: tokio::sync::Mutex::new(None),
        }
    }
}

/// One look: the names of the groups that had native members (or why the broker could not
/// say), and when the look began.
#[derive(Debug)]
struct Look<E> {
    began: Instant,
    /// When it ended: a failed look is shared only with callers that were waiting for it.
    ended: Instant,
    found: Result<Arc<HashSet<String>>, E>,
}

impl<E: Clone> NativeGroups<E> {
    /// The names of the groups with native members, as a look that began at `since` or later
    /// found them: the last look if it did, or a new one made with `look` (one at a time:
    /// callers that wait meanwhile share it). A look that failed is shared only by the callers
    /// that were waiting for it when it ended, so that a broker slow to fail costs each of
    /// them one look at most, not one for every caller queued before it, and a caller that
    /// comes later looks again.
    pub(crate) async fn seen_since<Looked>(
        &self,
        since: Instant,
        look: impl FnOnce() -> Looked,
    ) -> Result<Arc<HashSet<String>>, E>
    where
        Looked: Future<Output = Result<HashSet<String>, E>>,
    {
        let arrived = Instant::now();
        let mut last = self.last.lock().await;
        let shared = last
            .as_ref()
            .filter(|seen| seen.began >= since && (seen.found.is_ok() || arrived <= seen.ended));
        if let Some(seen) = shared {
            return seen.found.clone();
        }
        let began = Instant::now();
        let found = look().await.map(Arc::new);
        *last = Some(Look {
            began,
            ended: Instant::now(),
            found: found.clone(),
        });
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn named(names: &[&str]) -> HashSet<String> {
        names.iter().map(|name| name.to_string()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_look_is_shared_by_the_requests_it_began_after_and_made_anew_for_later_ones() {
        let native = NativeGroups::default();
        let looks = AtomicUsize::new(0);
        let look = || async {
            looks.fetch_add(1, Ordering::Relaxed);
            // The broker takes a while to describe itself.
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok::<_, ()>(named(&["g"]))
        };
        let arrived = Instant::now();
        let answers =
            futures::future::join_all((0..100).map(|_| native.seen_since(arrived, look))).await;
        assert!(answers
            .iter()
            .all(|names| names.as_ref().unwrap().contains("g")));
        assert_eq!(
            looks.load(Ordering::Relaxed),
            1,
            "one look for requests arriving together"
        );

        // A request that arrived after that look began makes its own.
        tokio::time::advance(Duration::from_millis(10)).await;
        native.seen_since(Instant::now(), look).await.unwrap();
        assert_eq!(looks.load(Ordering::Relaxed), 2);
        // One that accepts a look up to a second old uses it, until it is older.
        let recent = || Instant::now() - ADOPTION_LOOK_AGE;
        native.seen_since(recent(), look).await.unwrap();
        assert_eq!(looks.load(Ordering::Relaxed), 2);
        tokio::time::advance(ADOPTION_LOOK_AGE + Duration::from_millis(1)).await;
        native.seen_since(recent(), look).await.unwrap();
        assert_eq!(looks.load(Ordering::Relaxed), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_look_that_fails_is_shared_by_the_requests_it_began_after_only() {
        let native = NativeGroups::default();
        let looks = AtomicUsize::new(0);
        let failing = || async {
            looks.fetch_add(1, Ordering::Relaxed);
            // The broker takes its time to fail.
            tokio::time::sleep(Duration::from_secs(5)).await;
            Err::<HashSet<String>, _>("down")
        };
        let arrived = Instant::now();
        let answers =
            futures::future::join_all((0..50).map(|_| native.seen_since(arrived, failing))).await;
        assert!(answers.iter().all(|answer| answer == &Err("down")));
        assert_eq!(
            looks.load(Ordering::Relaxed),
            1,
            "one failed look for all of them"
        );
        // A request arriving after the failed look ended makes a new one, even one that would
        // take a look a second old.
        tokio::time::advance(Duration::from_millis(1)).await;
        let retried = native
            .seen_since(Instant::now() - ADOPTION_LOOK_AGE, || async {
                Ok::<_, &str>(named(&["native"]))
            })
            .await;
        assert!(retried.unwrap().contains("native"));
        // A request arriving after the failed look began makes a new one.
        let names = native
            .seen_since(Instant::now(), || async {
                Ok::<_, &str>(named(&["native"]))
            })
            .await
            .unwrap();
        assert!(names.contains("native"));
    }
}
