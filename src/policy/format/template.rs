//! The model's own chat template, rendered with minijinja exactly as HF `transformers` renders
//! it with jinja2 (`trim_blocks`, `lstrip_blocks`, `raise_exception`, Python-style `tojson`,
//! Python string methods).
//!
//! Invariant: for the same messages, tools and flags the output is byte-identical to
//! `tokenizer.apply_chat_template(..., tokenize=False)`; tests/format_template.rs checks it
//! against goldens made by the real `transformers`.

use std::path::Path;
use std::sync::Arc;

use minijinja::value::Value as JValue;
use minijinja::{Environment, ErrorKind};
use serde::Serialize;
use serde_json::Value;

use super::messages::Message;
use super::pycompat::{raise_exception, strftime_now, tojson_filter};
use super::tools::ToolDefinition;
use crate::error::{Error, Result};

const TEMPLATE_NAME: &str = "chat";

/// Flags of one render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenderOptions {
    /// Append the assistant header so the model continues as the assistant.
    pub add_generation_prompt: bool,
    /// Qwen3's `enable_thinking`; `None` leaves it undefined (the template's default: thinking on).
    pub enable_thinking: Option<bool>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            add_generation_prompt: true,
            enable_thinking: None,
        }
    }
}

/// A compiled chat template plus the special tokens HF passes to it. Cheap to clone.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    source: Arc<str>,
    special_tokens: Arc<serde_json::Map<String, Value>>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("special_tokens", &self.special_tokens)
            .finish()
    }
}

#[derive(Serialize)]
struct Context<'a> {
    messages: &'a [Message],
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a [ToolDefinition]>,
    add_generation_prompt: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    enable_thinking: Option<bool>,
}

impl ChatTemplate {
    /// Compiles a jinja chat template. `special_tokens` (for example `bos_token`,
    /// `eos_token`) become template variables as in HF.
    pub fn new(source: &str, special_tokens: serde_json::Map<String, Value>) -> Result<Self> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .keep_trailing_newline(false)
                .build()
                .map_err(|e| Error::Template(e.to_string()))?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson_filter);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        // A budget per render: a template that loops without end (or renders without bound)
        // fails with a clear error instead of holding a core and growing memory.
        env.set_fuel(Some(RENDER_FUEL));
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| Error::Template(format!("the chat template does not compile: {e}")))?;
        Ok(Self {
            env: Arc::new(env),
            source: source.into(),
            special_tokens: Arc::new(special_tokens),
        })
    }

    /// Reads the template of a model directory as HF does: `chat_template.jinja` if present,
    /// else `chat_template` of `tokenizer_config.json` (a string, or a list of named templates
    /// of which `tool_use` is taken when present, else `default`, else the first).
    pub fn from_model_dir(dir: &Path) -> Result<Self> {
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: Value = read_json(&cfg_path)?;
        let special = special_tokens(&cfg);
        let jinja = dir.join("chat_template.jinja");
        if jinja.is_file() {
            let src = std::fs::read_to_string(&jinja).map_err(|e| Error::file(&jinja, e))?;
            return Self::new(&src, special);
        }
        let source = match cfg.get("chat_template") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(list)) => {
                let pick = |n: &str| {
                    list.iter()
                        .find(|t| t.get("name").and_then(Value::as_str) == Some(n))
                };
                pick("tool_use")
                    .or_else(|| pick("default"))
                    .or(list.first())
                    .and_then(|t| t.get("template"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        Error::file(&cfg_path, "`chat_template` list has no usable template")
                    })?
                    .to_string()
            }
            _ => {
                return Err(Error::file(
                    &cfg_path,
                    "no `chat_template` (and no chat_template.jinja beside it); a chat model's tokenizer files are needed",
                ));
            }
        };
        Self::new(&source, special)
    }

    /// The jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation. `tools: None` (or an empty list) renders no tool block.
    pub fn render(
        &self,
        messages: &[Message],
        tools: Option<&[ToolDefinition]>,
        opts: RenderOptions,
    ) -> Result<String> {
        if messages.is_empty() {
            return Err(Error::InvalidInput(
                "cannot render an empty conversation".into(),
            ));
        }
        let ctx = Context {
            messages,
            tools: tools.filter(|t| !t.is_empty()),
            add_generation_prompt: opts.add_generation_prompt,
            enable_thinking: opts.enable_thinking,
        };
        let mut ctx_value = serde_json::to_value(&ctx)?;
        if let Value::Object(map) = &mut ctx_value {
            for (k, v) in self.special_tokens.iter() {
                map.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| Error::Template(e.to_string()))?;
        let mut out = CappedOutput::default();
        let rendered =
            tmpl.render_captured_to(JValue::from(minijinja::value::Serde(&ctx_value)), &mut out);
        if out.over {
            return Err(Error::Template(format!(
                "the chat template's output passed {} MiB: the model's chat template is broken or hostile; fix `chat_template` in its tokenizer_config.json",
                RENDER_OUTPUT_CAP >> 20
            )));
        }
        match rendered {
            Ok(_) => String::from_utf8(out.buf).map_err(|e| {
                Error::Template(format!("the chat template rendered invalid UTF-8: {e}"))
            }),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(Error::Template(format!(
                "the chat template ran past its budget of {RENDER_FUEL} instructions: the model's chat template is broken or hostile; fix `chat_template` in its tokenizer_config.json"
            ))),
            Err(e) => Err(Error::Template(format!("{e:#}"))),
        }
    }
}

/// Instructions one render may run (the real Qwen3 template renders a 200-turn conversation
/// in well under 1% of this).
const RENDER_FUEL: u64 = 20_000_000;

/// Bytes one render may write.
const RENDER_OUTPUT_CAP: usize = 64 << 20;

/// A render's output, refusing to grow past [`RENDER_OUTPUT_CAP`].
#[derive(Default)]
struct CappedOutput {
    buf: Vec<u8>,
    over: bool,
}

impl std::io::Write for CappedOutput {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + b.len() > RENDER_OUTPUT_CAP {
            self.over = true;
            return Err(std::io::Error::other("render output cap"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::file(path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::file(path, format!("not valid JSON: {e}")))
}

/// The special tokens of a `tokenizer_config.json` as strings (`AddedToken` dicts unwrapped).
pub(crate) fn special_tokens(cfg: &Value) -> serde_json::Map<String, Value> {
    let mut out = serde_json::Map::new();
    for key in ["bos_token", "eos_token", "unk_token", "pad_token"] {
        let v = match cfg.get(key) {
            Some(Value::String(s)) => Value::String(s.clone()),
            Some(Value::Object(o)) => o.get("content").cloned().unwrap_or(Value::Null),
            _ => continue,
        };
        if !v.is_null() {
            out.insert(key.to_string(), v);
        }
    }
    out
}
