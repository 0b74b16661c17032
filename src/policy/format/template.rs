//! The model's own chat template, rendered with minijinja exactly as HF `transformers` renders
//! it with jinja2 (`trim_blocks`, `lstrip_blocks`, `raise_exception`, Python-style `tojson`,
//! Python string methods).
//!
//! Invariant: for the same messages, tools and flags the output is byte-identical to
//! `tokenizer.apply_chat_template(..., tokenize=False)`; tests/format_template.rs checks it
//! against goldens made by the real `transformers`.

use std::path::Path;
use std::sync::Arc;

use minijinja::value::{Kwargs, Value as JValue};
use minijinja::{Environment, ErrorKind};
use serde::Serialize;
use serde_json::Value;

use super::messages::Message;
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

fn raise_exception(msg: String) -> std::result::Result<JValue, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
}

/// `strftime_now(fmt)` as HF provides it (UTC; %Y %m %d %H %M %S %B %b %%).
fn strftime_now(fmt: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('H') => out.push_str(&format!("{:02}", sod / 3600)),
            Some('M') => out.push_str(&format!("{:02}", sod / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", sod % 60)),
            Some('B') => out.push_str(MONTHS[(m - 1) as usize]),
            Some('b') => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// HF's `tojson`: `json.dumps(x, ensure_ascii=False, indent=indent, separators=separators,
/// sort_keys=sort_keys)`, returned as safe (unescaped) text.
fn tojson_filter(value: &JValue, kwargs: Kwargs) -> std::result::Result<JValue, minijinja::Error> {
    let indent: Option<JValue> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<JValue> = kwargs.get("separators")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_usize() {
            Some(n) => Some(" ".repeat(n)),
            None => Some(v.to_string()),
        },
    };
    let (item_sep, key_sep) = match separators {
        Some(s) if !s.is_none() => {
            let a = s.get_item(&JValue::from(0))?.to_string();
            let b = s.get_item(&JValue::from(1))?.to_string();
            (a, b)
        }
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let style = PyJson {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    style.write(&json, 0, &mut out);
    Ok(JValue::from_safe_string(out))
}

/// Python `json.dumps` layout (`ensure_ascii=False`).
pub(crate) struct PyJson {
    pub indent: Option<String>,
    pub item_sep: String,
    pub key_sep: String,
    pub sort_keys: bool,
}

impl PyJson {
    /// `json.dumps(v, ensure_ascii=False)` with the default separators.
    pub(crate) fn compact() -> Self {
        Self {
            indent: None,
            item_sep: ", ".into(),
            key_sep: ": ".into(),
            sort_keys: false,
        }
    }

    fn newline(&self, depth: usize, out: &mut String) {
        if let Some(ind) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(ind);
            }
        }
    }

    pub(crate) fn write(&self, v: &Value, depth: usize, out: &mut String) {
        match v {
            Value::Null => out.push_str("null"),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Number(n) => {
                if let Some(f) = n.as_f64().filter(|_| n.is_f64()) {
                    out.push_str(&py_float(f));
                } else {
                    out.push_str(&n.to_string());
                }
            }
            Value::String(s) => write_json_string(s, out),
            Value::Array(items) => {
                if items.is_empty() {
                    out.push_str("[]");
                    return;
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(depth + 1, out);
                    self.write(item, depth + 1, out);
                }
                self.newline(depth, out);
                out.push(']');
            }
            Value::Object(map) => {
                if map.is_empty() {
                    out.push_str("{}");
                    return;
                }
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, val)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(depth + 1, out);
                    write_json_string(k, out);
                    out.push_str(&self.key_sep);
                    self.write(val, depth + 1, out);
                }
                self.newline(depth, out);
                out.push('}');
            }
        }
    }
}

fn write_json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: shortest round-trip digits, fixed notation for exponents in
/// [-4, 16), otherwise `1e+16` / `1e-05` style.
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    let sci = format!("{f:e}"); // shortest round-trip, e.g. "-1.25e-5"
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // position of the decimal point within digits
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if point as usize >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        };
        format!("{sign}{body}")
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{m}e{esign}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn py_float_matches_python_repr() {
        for (f, want) in [
            (1.0, "1.0"),
            (2.5, "2.5"),
            (100.0, "100.0"),
            (0.1, "0.1"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1234567890123456.0, "1234567890123456.0"),
            (-0.5, "-0.5"),
            (1.5e-7, "1.5e-07"),
            (0.0, "0.0"),
        ] {
            assert_eq!(py_float(f), want, "{f}");
        }
    }

    #[test]
    fn civil_date_of_known_days() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_786), (2026, 11, 29));
    }
}
