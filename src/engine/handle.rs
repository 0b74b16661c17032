//! A one-shot reply slot: the scheduler fills it, the caller blocks on it or awaits it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};

struct Slot<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
}

struct State<T> {
    value: Option<Result<T>>,
    closed: bool,
    waker: Option<Waker>,
}

/// The caller's side: wait with [`Pending::wait`] or `.await` it.
pub struct Pending<T> {
    slot: Arc<Slot<T>>,
}

/// The scheduler's side; dropping it unanswered makes the caller see [`Error::EngineStopped`].
pub(crate) struct Replier<T> {
    slot: Option<Arc<Slot<T>>>,
}

pub(crate) fn channel<T>() -> (Replier<T>, Pending<T>) {
    let slot = Arc::new(Slot {
        state: Mutex::new(State {
            value: None,
            closed: false,
            waker: None,
        }),
        ready: Condvar::new(),
    });
    (
        Replier {
            slot: Some(slot.clone()),
        },
        Pending { slot },
    )
}

impl<T> Replier<T> {
    /// Whether the caller dropped its [`Pending`] (a disconnected client): nobody will read
    /// the result, so the work can stop.
    pub(crate) fn is_abandoned(&self) -> bool {
        self.slot.as_ref().is_none_or(|s| Arc::strong_count(s) == 1)
    }

    pub(crate) fn send(mut self, value: Result<T>) {
        if let Some(slot) = self.slot.take() {
            let mut st = slot.state.lock();
            st.value = Some(value);
            st.closed = true;
            if let Some(w) = st.waker.take() {
                w.wake();
            }
            slot.ready.notify_all();
        }
    }
}

impl<T> Drop for Replier<T> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            let mut st = slot.state.lock();
            st.closed = true;
            if let Some(w) = st.waker.take() {
                w.wake();
            }
            slot.ready.notify_all();
        }
    }
}

impl<T> Pending<T> {
    /// Blocks until the result is there.
    pub fn wait(self) -> Result<T> {
        let mut st = self.slot.state.lock();
        while !st.closed {
            self.slot.ready.wait(&mut st);
        }
        st.value.take().unwrap_or(Err(Error::EngineStopped))
    }

    /// Whether the result is ready.
    pub fn is_ready(&self) -> bool {
        self.slot.state.lock().closed
    }
}

impl<T> Future for Pending<T> {
    type Output = Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut st = self.slot.state.lock();
        if st.closed {
            return Poll::Ready(st.value.take().unwrap_or(Err(Error::EngineStopped)));
        }
        st.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}
