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

struct StreamState {
    chunks: std::collections::VecDeque<String>,
    closed: bool,
    waker: Option<Waker>,
}

struct StreamSlot {
    state: Mutex<StreamState>,
    ready: Condvar,
}

/// Text of a generation as it is produced, chunk by chunk (see
/// [`Engine::submit_streaming`](super::Engine::submit_streaming)). Ends when the generation
/// ends; the final [`Generation`](super::Generation) comes from the `Pending` as usual.
pub struct TokenStream {
    slot: Arc<StreamSlot>,
}

/// The scheduler's side of a [`TokenStream`]; dropping it ends the stream.
pub(crate) struct StreamSender {
    slot: Arc<StreamSlot>,
}

pub(crate) fn stream() -> (StreamSender, TokenStream) {
    let slot = Arc::new(StreamSlot {
        state: Mutex::new(StreamState {
            chunks: Default::default(),
            closed: false,
            waker: None,
        }),
        ready: Condvar::new(),
    });
    (StreamSender { slot: slot.clone() }, TokenStream { slot })
}

impl StreamSender {
    pub(crate) fn send(&self, text: &str) {
        if text.is_empty() {
            return;
        }
        let mut st = self.slot.state.lock();
        st.chunks.push_back(text.to_string());
        if let Some(w) = st.waker.take() {
            w.wake();
        }
        self.slot.ready.notify_all();
    }
}

impl Drop for StreamSender {
    fn drop(&mut self) {
        let mut st = self.slot.state.lock();
        st.closed = true;
        if let Some(w) = st.waker.take() {
            w.wake();
        }
        self.slot.ready.notify_all();
    }
}

impl TokenStream {
    /// Blocks for the next chunk; `None` when the generation ended.
    pub fn next_blocking(&mut self) -> Option<String> {
        let mut st = self.slot.state.lock();
        loop {
            if let Some(c) = st.chunks.pop_front() {
                return Some(c);
            }
            if st.closed {
                return None;
            }
            self.slot.ready.wait(&mut st);
        }
    }

    /// Awaits the next chunk; `None` when the generation ended.
    pub fn next_chunk(&mut self) -> NextChunk<'_> {
        NextChunk { stream: self }
    }
}

/// The future of [`TokenStream::next_chunk`].
pub struct NextChunk<'a> {
    stream: &'a mut TokenStream,
}

impl Future for NextChunk<'_> {
    type Output = Option<String>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut st = self.stream.slot.state.lock();
        if let Some(c) = st.chunks.pop_front() {
            return Poll::Ready(Some(c));
        }
        if st.closed {
            return Poll::Ready(None);
        }
        st.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}
