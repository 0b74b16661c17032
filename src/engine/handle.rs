//! A one-shot reply slot: the scheduler fills it, the caller blocks on it or awaits it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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

/// A flag that cancels work from another thread: set by [`CancelToken::cancel`] (or by
/// dropping a [`CancelOnDrop`]), read by [`Pending::wait_cancellable`]. Clones share the flag.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A token not cancelled yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancels: every waiter on this token (and its clones) gives up.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether [`CancelToken::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Whether `other` is a clone of this token (the same flag).
    pub fn same_as(&self, other: &CancelToken) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// A guard that cancels this token when dropped (e.g. with the future of a request whose
    /// client went away).
    pub fn cancel_on_drop(&self) -> CancelOnDrop {
        CancelOnDrop(self.clone())
    }
}

/// Cancels its [`CancelToken`] when dropped.
#[derive(Debug)]
pub struct CancelOnDrop(CancelToken);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// How often a cancellable wait looks at its token.
const CANCEL_POLL: std::time::Duration = std::time::Duration::from_millis(5);

impl<T> Pending<T> {
    /// [`Pending::wait`], giving up as soon as `cancel` is set: the request is then dropped
    /// (the engine frees its sequence) and the result is [`Error::Cancelled`].
    pub fn wait_cancellable(self, cancel: &CancelToken) -> Result<T> {
        let mut st = self.slot.state.lock();
        while !st.closed {
            if cancel.is_cancelled() {
                drop(st);
                drop(self);
                return Err(Error::Cancelled(
                    "the request was cancelled before it finished".into(),
                ));
            }
            self.slot.ready.wait_for(&mut st, CANCEL_POLL);
        }
        st.value.take().unwrap_or(Err(Error::EngineStopped))
    }

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
