//! Output processing that overlaps the next step: the text of a sequence without stop strings
//! is decoded while the next step runs (or at its finish), the text of one with stop strings at
//! once. Both must give the same tokens and text, alone or batched, streamed or not.

mod common;

use common::prompt;
use policy_serve::engine::DeviceChoice;
use policy_serve::{EngineOptions, GenerationRequest, ModelRegistry};

fn engine() -> (ModelRegistry, policy_serve::Engine) {
    let r = common::tiny_registry(EngineOptions {
        device: DeviceChoice::Cpu,
        ..EngineOptions::default()
    });
    let e = r.model("tiny").unwrap().engine().clone();
    (r, e)
}

fn request(i: usize, stop: bool) -> GenerationRequest {
    let mut r = GenerationRequest::new(prompt(6 + 3 * i, 700 + i as u32)).max_new_tokens(4 + 3 * i);
    r.ignore_eos = true;
    if stop {
        // A stop string no text of this model contains: only the decoding path changes.
        r.stop = vec!["\u{1}never\u{2}".into()];
    }
    r
}

#[test]
fn deferred_and_immediate_decoding_give_the_same_text_alone_and_batched() {
    let (_r, e) = engine();
    assert!(
        e.info().cuda_graph_buckets.is_empty(),
        "no CUDA graphs on the CPU"
    );
    let alone: Vec<_> = (0..6)
        .map(|i| e.generate(request(i, false)).unwrap())
        .collect();
    // The same requests in one batch, each twice: once deferred, once decoded at once.
    let pending: Vec<_> = (0..6)
        .flat_map(|i| [e.submit(request(i, false)), e.submit(request(i, true))])
        .collect();
    let batched: Vec<_> = pending.into_iter().map(|p| p.wait().unwrap()).collect();
    for (i, a) in alone.iter().enumerate() {
        assert_eq!(a.tokens.len(), 4 + 3 * i);
        // The text holds every generated token: it decodes to what the tokens decode to.
        let whole = e.tokenizer().decode(&a.tokens, false).unwrap();
        assert_eq!(a.text, whole, "request {i} alone");
        for g in &batched[2 * i..2 * i + 2] {
            assert_eq!(g.tokens, a.tokens, "request {i} batched");
            assert_eq!(g.text, a.text, "request {i} batched");
        }
    }
}

#[test]
fn streamed_text_of_deferred_decoding_adds_up_and_arrives_before_the_end() {
    let (_r, e) = engine();
    let (pending, mut stream) = e.submit_streaming(request(5, false));
    let mut chunks = Vec::new();
    while let Some(c) = stream.next_blocking() {
        chunks.push(c);
    }
    let g = pending.wait().unwrap();
    assert_eq!(chunks.concat(), g.text);
    assert!(
        chunks.len() > 2,
        "text streamed as it was generated, not all at the end: {chunks:?}"
    );
}
