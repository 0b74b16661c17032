//! Masks at a place where the grammar takes up to `L` more characters of JSON string content
//! (inside a string with `maxLength`: llguidance's slices cover only string content of
//! unbounded length, so it walks every token longer than the room left to the depth where it
//! fails: ~50k tokens, 1-2.5 ms a mask).
//!
//! Here the lexer's automaton is explored one character at a time from the current state (the
//! UTF-8 encodings of every string-content character, the states after each byte kept once):
//! when every sequence of `L` characters keeps the lexer inside its lexeme and every sequence of
//! `L + 1` fails, the mask is the tokens of 1..=`L` content characters (precomputed) plus the
//! tokens with other bytes (quotes, escapes, control bytes, partial characters: a trie of
//! their own), walked as llguidance walks them. Anywhere else (a number, a key, an unbounded
//! string, a place where a lexeme may end) the exploration gives up within a few transitions
//! and llguidance computes the mask. Either way the mask is the one llguidance computes.

use std::mem::discriminant;
use std::sync::Arc;

use llguidance::derivre::StateID;
use llguidance::earley::{BiasComputer, ParserRecognizer};
use llguidance::toktrie::{SimpleVob, TokTrie};

/// The longest room left (in characters) the shortcut handles; beyond it llguidance's own
/// slices (string content of up to 10 and 30 characters) are cheap enough.
pub(crate) const MAX_ROOM: usize = 32;

/// A bias computer that takes the shortcut above where it applies and `inner` elsewhere.
pub(crate) struct Bounded {
    inner: Arc<dyn BiasComputer>,
    /// The index of llguidance's slice of unbounded string content among the parser's extra
    /// lexemes: where it applies, llguidance's own mask is cheap, and the exploration would
    /// run to its limit for nothing.
    unbounded: usize,
    /// `upto[k]`: the tokens of 1..=k string-content characters.
    upto: Vec<SimpleVob>,
    /// The tokens that are not string content alone.
    rest: TokTrie,
}

/// Whether `c` may stand in a JSON string unescaped.
fn is_content(c: char) -> bool {
    c >= ' ' && c != '"' && c != '\\' && c != '\x7f'
}

/// How many string-content characters `bytes` are, if that is all they are.
fn content_chars(bytes: &[u8]) -> Option<usize> {
    let s = std::str::from_utf8(bytes).ok()?;
    s.chars().all(is_content).then(|| s.chars().count())
}

impl Bounded {
    /// The shortcut over `inner`'s trie, `inner` elsewhere; `unbounded` is the index of the
    /// slice of unbounded string content among the slices the parsers were made with.
    pub(crate) fn new(inner: Arc<dyn BiasComputer>, unbounded: usize) -> Self {
        let trie = inner.trie();
        let mut upto: Vec<SimpleVob> = (0..=MAX_ROOM).map(|_| trie.alloc_token_set()).collect();
        let mut rest = trie.alloc_token_set();
        for t in 0..trie.vocab_size() as u32 {
            let bytes = trie.token(t);
            if bytes.is_empty() {
                continue;
            }
            match content_chars(bytes) {
                Some(k) => {
                    for set in upto.iter_mut().skip(k) {
                        set.allow_token(t);
                    }
                }
                None => rest.allow_token(t),
            }
        }
        let rest = trie.filter(&rest);
        Self {
            inner,
            unbounded,
            upto,
            rest,
        }
    }
}

impl BiasComputer for Bounded {
    fn compute_bias(&self, rec: &mut ParserRecognizer<'_>, start: &[u8]) -> SimpleVob {
        let room = if start.is_empty() {
            let state = rec.lexer_state();
            room_left(
                &mut Dfa {
                    rec: &mut *rec,
                    unbounded: self.unbounded,
                },
                state,
            )
        } else {
            None
        };
        let Some(room) = room else {
            return self.inner.compute_bias(rec, start);
        };
        let mut set = self.trie().alloc_token_set();
        if room > 0 {
            set.or(&self.upto[room]);
        }
        self.rest.add_bias(rec, &mut set, &[]);
        set
    }

    fn trie(&self) -> &TokTrie {
        self.inner.trie()
    }
}

/// The lexer's automaton as the exploration needs it.
trait Automaton {
    /// The state after `byte` (dead, or a state where a lexeme matched lazily, included).
    fn step(&mut self, state: StateID, byte: u8) -> StateID;
    /// Whether a lexeme may end at `state` (a byte the automaton refuses there would start
    /// the next lexeme instead of failing).
    fn accepting(&mut self, state: StateID) -> bool;
    /// Whether every string of content characters, however long, may follow `state` (an
    /// unbounded string: no room to find).
    fn unbounded(&mut self, state: StateID) -> bool;
}

/// The recognizer's lexer.
struct Dfa<'r, 'a> {
    rec: &'r mut ParserRecognizer<'a>,
    unbounded: usize,
}

impl Automaton for Dfa<'_, '_> {
    fn step(&mut self, state: StateID, byte: u8) -> StateID {
        // The transition the recognizer's own byte push takes (`Lexer::advance`).
        self.rec
            .lexer_mut()
            .transition_start_state(state, Some(byte), &None)
    }

    fn unbounded(&mut self, state: StateID) -> bool {
        // llguidance's own test for applying that slice (the budget its slicer gives it).
        let lexer = self.rec.lexer_mut();
        lexer.subsume_possible(state)
            && lexer
                .check_subsume(state, self.unbounded, 1000, None)
                .unwrap_or(false)
    }

    fn accepting(&mut self, state: StateID) -> bool {
        // `try_lexeme_end` is an error exactly where no lexeme accepts; its result type is
        // private to llguidance, so it is told apart from the dead state's (which accepts
        // nothing) by its variant.
        let lexer = self.rec.lexer_mut();
        let nothing = discriminant(&lexer.try_lexeme_end(StateID::DEAD));
        discriminant(&lexer.try_lexeme_end(state)) != nothing
    }
}

/// A range of bytes, both ends included.
type Bytes = (u8, u8);
/// The encodings of some characters: the lead byte's range, the second byte's range, and how
/// many continuation bytes (0x80-0xBF) follow the second.
type Encoding = (Bytes, Bytes, usize);

/// The UTF-8 encodings of the string-content characters of two bytes or more, by lead byte.
const MULTI_BYTE: [Encoding; 8] = [
    ((0xC2, 0xDF), (0x80, 0xBF), 0),
    ((0xE0, 0xE0), (0xA0, 0xBF), 1),
    ((0xE1, 0xEC), (0x80, 0xBF), 1),
    ((0xED, 0xED), (0x80, 0x9F), 1),
    ((0xEE, 0xEF), (0x80, 0xBF), 1),
    ((0xF0, 0xF0), (0x90, 0xBF), 2),
    ((0xF1, 0xF3), (0x80, 0xBF), 2),
    ((0xF4, 0xF4), (0x80, 0x8F), 2),
];

/// What one character from a set of states gives.
enum Step {
    /// Every character keeps every state alive: the states after it.
    All(Vec<StateID>),
    /// Every character fails from every state.
    None,
    /// Some do, some do not, or a lexeme may end on the way: no shortcut.
    Mixed,
}

fn push_unique(v: &mut Vec<StateID>, s: StateID) {
    if !v.contains(&s) {
        v.push(s);
    }
}

/// Moves `from` by every byte in `range` into `into`, noting in `died` whether a byte failed;
/// false when the exploration must stop (a lexeme may end there).
fn walk<A: Automaton + ?Sized>(
    a: &mut A,
    from: StateID,
    range: Bytes,
    into: &mut Vec<StateID>,
    died: &mut bool,
) -> bool {
    let mut checked = false;
    for b in range.0..=range.1 {
        let t = a.step(from, b);
        if t.is_dead() {
            // A byte the automaton refuses fails the push only where no lexeme accepts.
            if !checked && a.accepting(from) {
                return false;
            }
            checked = true;
            *died = true;
        } else if t.has_lowest_match() {
            return false;
        } else {
            push_unique(into, t);
        }
    }
    true
}

/// One string-content character from each of `states`.
fn one_char(a: &mut impl Automaton, states: &[StateID]) -> Step {
    let mut died = false;
    let mut done: Vec<StateID> = Vec::new();
    // States waiting for 1 and for 2 more continuation bytes.
    let mut waiting: [Vec<StateID>; 2] = Default::default();
    for &s in states {
        // One byte: printable ASCII but the quote and the backslash (first: most places that
        // are not string content are told apart here).
        for range in [(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x7E)] {
            if !walk(a, s, range, &mut done, &mut died) || (died && !done.is_empty()) {
                return Step::Mixed;
            }
        }
        for (lead, second, conts) in MULTI_BYTE {
            let mut after_lead = Vec::new();
            if !walk(a, s, lead, &mut after_lead, &mut died) {
                return Step::Mixed;
            }
            for t in after_lead {
                let into = if conts == 0 {
                    &mut done
                } else {
                    &mut waiting[conts - 1]
                };
                if !walk(a, t, second, into, &mut died) {
                    return Step::Mixed;
                }
            }
        }
    }
    for t in std::mem::take(&mut waiting[1]) {
        if !walk(a, t, (0x80, 0xBF), &mut waiting[0], &mut died) {
            return Step::Mixed;
        }
    }
    for t in std::mem::take(&mut waiting[0]) {
        if !walk(a, t, (0x80, 0xBF), &mut done, &mut died) {
            return Step::Mixed;
        }
    }
    match (died, done.is_empty()) {
        (false, false) => Step::All(done),
        (true, true) => Step::None,
        _ => Step::Mixed,
    }
}

/// How many string-content characters the lexer takes from `state` with nothing else allowed
/// in their place: `Some(L)` when every sequence of up to `L` characters stays inside the
/// lexeme and every sequence of `L + 1` fails (`L <= MAX_ROOM`); `None` otherwise.
fn room_left(a: &mut impl Automaton, state: StateID) -> Option<usize> {
    if state.is_dead() || state.has_lowest_match() {
        return None;
    }
    let mut live = vec![state];
    for room in 0..=MAX_ROOM {
        match one_char(a, &live) {
            // String content here: unless it is unbounded.
            Step::All(_) if room == 0 && a.unbounded(state) => return None,
            Step::All(next) => live = next,
            Step::None => return Some(room),
            Step::Mixed => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy automaton over state numbers: `room` string characters, counted in bytes of
    /// each character's encoding, then only a quote.
    struct Toy {
        room: u32,
        accepting_at: Option<u32>,
        refuse: Option<u8>,
        /// Steps taken, to see the exploration stop early.
        steps: usize,
    }

    // State ids: 2 + 8 * chars_taken + continuation bytes still wanted (0..=3).
    fn id(chars: u32, want: u32) -> StateID {
        StateID::new(2 + 8 * chars + want)
    }

    impl Automaton for Toy {
        fn step(&mut self, state: StateID, byte: u8) -> StateID {
            self.steps += 1;
            let n = state.as_u32() - 2;
            let (chars, want) = (n / 8, n % 8);
            if Some(byte) == self.refuse {
                return StateID::DEAD;
            }
            match (want, byte) {
                (0, b) if chars < self.room && b < 0x80 => id(chars + 1, 0),
                (0, 0xC2..=0xDF) if chars < self.room => id(chars, 1),
                (0, 0xE0..=0xEF) if chars < self.room => id(chars, 2),
                (0, 0xF0..=0xF4) if chars < self.room => id(chars, 3),
                (1, 0x80..=0xBF) => id(chars + 1, 0),
                (w, 0x80..=0xBF) if w > 1 => id(chars, w - 1),
                _ => StateID::DEAD,
            }
        }

        fn accepting(&mut self, state: StateID) -> bool {
            Some((state.as_u32() - 2) / 8) == self.accepting_at
        }

        fn unbounded(&mut self, _: StateID) -> bool {
            self.room == u32::MAX
        }
    }

    #[test]
    fn the_room_left_is_found_and_anything_else_gives_up() {
        let toy = |room, accepting_at, refuse| Toy {
            room,
            accepting_at,
            refuse,
            steps: 0,
        };
        for room in [0, 1, 5, 17, MAX_ROOM as u32] {
            assert_eq!(
                room_left(&mut toy(room, None, None), id(0, 0)),
                Some(room as usize)
            );
            // Half-way through, the same.
            if room > 2 {
                assert_eq!(
                    room_left(&mut toy(room, None, None), id(2, 0)),
                    Some(room as usize - 2)
                );
            }
        }
        // More room than the shortcut handles.
        assert_eq!(
            room_left(&mut toy(MAX_ROOM as u32 + 1, None, None), id(0, 0)),
            None
        );
        // Unbounded: given up after one character, not explored to the limit.
        let mut t = toy(u32::MAX, None, None);
        assert_eq!(room_left(&mut t, id(0, 0)), None);
        let one_char_steps = {
            let mut t = toy(5, None, None);
            one_char(&mut t, &[id(0, 0)]);
            t.steps
        };
        assert_eq!(t.steps, one_char_steps);
        // One character refused where others are taken (a pattern, an enum): no shortcut.
        assert_eq!(room_left(&mut toy(5, None, Some(b'q')), id(0, 0)), None);
        assert_eq!(room_left(&mut toy(5, None, Some(0xA3)), id(0, 0)), None);
        // A lexeme may end where the room runs out (a byte refused there would start the
        // next lexeme): no shortcut; where every byte is taken, acceptance does not matter.
        assert_eq!(room_left(&mut toy(5, Some(5), None), id(0, 0)), None);
        assert_eq!(room_left(&mut toy(0, Some(0), None), id(0, 0)), None);
        assert_eq!(room_left(&mut toy(5, Some(3), None), id(0, 0)), Some(5));
        assert_eq!(room_left(&mut toy(5, None, None), StateID::DEAD), None);
    }

    #[test]
    fn content_characters_are_counted_as_json_strings_take_them() {
        assert_eq!(content_chars(b"abc"), Some(3));
        assert_eq!(content_chars(" caf\u{e9}".as_bytes()), Some(5));
        assert_eq!(content_chars("\u{1F600}x".as_bytes()), Some(2));
        assert_eq!(content_chars(b"a\"b"), None);
        assert_eq!(content_chars(b"a\\"), None);
        assert_eq!(content_chars(b"\n"), None);
        assert_eq!(content_chars(b"\x7f"), None);
        assert_eq!(content_chars(&[0xE4, 0xBD]), None);
    }
}
