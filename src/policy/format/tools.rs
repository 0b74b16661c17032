//! Tool definitions in the OpenAI/TRL function schema, and validation of calls against them.
//!
//! Key order is preserved end to end (serde_json `preserve_order`): the template renders the
//! schema with `tojson`, so the bytes the model sees follow the order the host wrote.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// One tool the policy may call: `{"type": "function", "function": {...}}`, or a bare
/// function schema `{"name", "description", "parameters"}` (HF's templates take any dict).
///
/// A tool parsed from JSON renders exactly as it was given (shape and key order), as HF's
/// `apply_chat_template` renders it; a tool built in code renders in the wrapped shape.
#[derive(Debug, Clone)]
pub struct ToolDefinition {
    /// Always `"function"`.
    pub kind: String,
    /// The function's name, description and JSON-schema parameters.
    pub function: FunctionDefinition,
    /// The JSON the tool was parsed from (rendered as is); `None` for a tool built in code.
    source: Option<Value>,
}

impl PartialEq for ToolDefinition {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.function == other.function
    }
}

#[derive(Serialize, Deserialize)]
struct Wrapped<F> {
    #[serde(rename = "type", default = "function_type")]
    kind: String,
    function: F,
}

impl Serialize for ToolDefinition {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match &self.source {
            Some(v) => v.serialize(s),
            None => Wrapped {
                kind: self.kind.clone(),
                function: &self.function,
            }
            .serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for ToolDefinition {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        Self::from_value(v).map_err(serde::de::Error::custom)
    }
}

fn function_type() -> String {
    "function".to_string()
}

/// The `function` part of a [`ToolDefinition`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionDefinition {
    /// Name the model calls the tool by.
    pub name: String,
    /// What the tool does, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON schema of the arguments object (`{"type": "object", "properties": .., "required": ..}`).
    #[serde(default = "empty_object_schema")]
    pub parameters: Value,
    /// Any further keys (for example `return`), rendered after the ones above.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn empty_object_schema() -> Value {
    serde_json::json!({"type": "object", "properties": {}})
}

impl ToolDefinition {
    /// A tool with no parameters yet; add them with [`ToolDefinition::param`].
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            kind: function_type(),
            function: FunctionDefinition {
                name: name.into(),
                description: Some(description.into()),
                parameters: empty_object_schema(),
                extra: Map::new(),
            },
            source: None,
        }
    }

    /// A tool from its JSON: wrapped (`{"type": "function", "function": {..}}`) or bare
    /// (`{"name", ..}`); it renders as given.
    fn from_value(v: Value) -> std::result::Result<Self, String> {
        let obj = v
            .as_object()
            .ok_or_else(|| format!("a tool must be a JSON object, got {v}"))?;
        let (kind, function) = if obj.contains_key("function") {
            let w: Wrapped<FunctionDefinition> =
                serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
            (w.kind, w.function)
        } else if obj.contains_key("name") {
            let f: FunctionDefinition =
                serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
            (function_type(), f)
        } else {
            return Err(
                "a tool is {\"type\": \"function\", \"function\": {..}} or a bare function schema {\"name\", \"description\", \"parameters\"}"
                    .into(),
            );
        };
        Ok(Self {
            kind,
            function,
            source: Some(v),
        })
    }

    /// Adds a parameter with a JSON type (`"string"`, `"integer"`, ...) and a description.
    pub fn param(mut self, name: &str, json_type: &str, description: &str, required: bool) -> Self {
        // Changed in code: it renders from its fields from now on.
        self.source = None;
        let params = self
            .function
            .parameters
            .as_object_mut()
            .expect("object schema");
        let props = params
            .entry("properties")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(props) = props {
            props.insert(
                name.to_string(),
                serde_json::json!({"type": json_type, "description": description}),
            );
        }
        if required {
            let req = params
                .entry("required")
                .or_insert_with(|| Value::Array(vec![]));
            if let Value::Array(req) = req {
                req.push(Value::String(name.to_string()));
            }
        }
        self
    }

    /// Parses one tool from JSON (OpenAI/TRL shape).
    pub fn from_json(json: &str) -> Result<Self> {
        let tool: Self = serde_json::from_str(json)
            .map_err(|e| Error::InvalidInput(format!("tool definition is not valid: {e}")))?;
        tool.check()?;
        Ok(tool)
    }

    /// Parses a JSON list of tools (as HF's `tools=` takes it).
    pub fn list_from_json(json: &str) -> Result<Vec<Self>> {
        let tools: Vec<Self> = serde_json::from_str(json).map_err(|e| {
            Error::InvalidInput(format!(
                "tools must be a JSON list of {{\"type\": \"function\", \"function\": {{..}}}} or of bare function schemas: {e}"
            ))
        })?;
        for t in &tools {
            t.check()?;
        }
        Ok(tools)
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.function.name
    }

    fn check(&self) -> Result<()> {
        if self.kind != "function" {
            return Err(Error::InvalidInput(format!(
                "tool `{}` has type `{}`; only \"function\" tools are supported",
                self.function.name, self.kind
            )));
        }
        if self.function.name.trim().is_empty() {
            return Err(Error::InvalidInput("a tool has an empty name".into()));
        }
        if !self.function.parameters.is_object() {
            return Err(Error::InvalidInput(format!(
                "tool `{}`: `parameters` must be a JSON-schema object",
                self.function.name
            )));
        }
        Ok(())
    }

    /// Names of the required parameters.
    pub fn required(&self) -> Vec<&str> {
        self.function
            .parameters
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    }

    /// The `properties` object of the parameters schema, if any.
    pub fn properties(&self) -> Option<&Map<String, Value>> {
        self.function
            .parameters
            .get("properties")
            .and_then(Value::as_object)
    }

    /// Checks a call's arguments against this tool's schema: required keys present, JSON types
    /// and enums as declared, no unknown keys when `additionalProperties` is false.
    pub fn validate_arguments(&self, args: &Map<String, Value>) -> std::result::Result<(), String> {
        let name = self.name();
        for req in self.required() {
            if !args.contains_key(req) {
                return Err(format!("call to `{name}` misses required argument `{req}`"));
            }
        }
        let props = self.properties();
        let closed =
            self.function.parameters.get("additionalProperties") == Some(&Value::Bool(false));
        for (key, value) in args {
            match props.and_then(|p| p.get(key)) {
                Some(schema) => check_value(schema, value)
                    .map_err(|e| format!("argument `{key}` of `{name}`: {e}"))?,
                None if closed => {
                    return Err(format!("call to `{name}` has unknown argument `{key}`"));
                }
                None => {}
            }
        }
        Ok(())
    }
}

/// Checks one JSON value against a (small subset of) JSON schema: `type` (one or a list),
/// `enum`, array `items`, nested object `properties`/`required`.
fn check_value(schema: &Value, value: &Value) -> std::result::Result<(), String> {
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        return Err(format!(
            "{value} is not one of {}",
            Value::Array(allowed.clone())
        ));
    }
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => return Ok(()),
    };
    if !types.iter().any(|t| type_matches(t, value)) {
        return Err(format!(
            "expected {}, got {}",
            types.join(" or "),
            json_type_name(value)
        ));
    }
    match value {
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check_value(item_schema, item).map_err(|e| format!("item {i}: {e}"))?;
                }
            }
        }
        Value::Object(obj) => {
            if let Some(req) = schema.get("required").and_then(Value::as_array) {
                for r in req.iter().filter_map(Value::as_str) {
                    if !obj.contains_key(r) {
                        return Err(format!("missing required key `{r}`"));
                    }
                }
            }
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, v) in obj {
                    if let Some(s) = props.get(k) {
                        check_value(s, v).map_err(|e| format!("key `{k}`: {e}"))?;
                    }
                }
            }
        }
        _ => {}
    }
    Ok(())
}

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "string" => v.is_string(),
        "integer" => {
            v.as_i64().is_some()
                || v.as_u64().is_some()
                || v.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        "null" => v.is_null(),
        _ => true,
    }
}

fn json_type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Makes arguments that satisfy a tool's schema (used by the demo policy): required
/// parameters only, first enum value, a placeholder per JSON type.
pub fn example_arguments(tool: &ToolDefinition) -> Map<String, Value> {
    let mut out = Map::new();
    if let Some(props) = tool.properties() {
        for req in tool.required() {
            let schema = props.get(req).cloned().unwrap_or(Value::Null);
            out.insert(req.to_string(), example_value(&schema, req));
        }
    }
    out
}

fn example_value(schema: &Value, name: &str) -> Value {
    if let Some(first) = schema
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
    {
        return first.clone();
    }
    let t = match schema.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .next()
            .unwrap_or("string"),
        _ => "string",
    };
    match t {
        "integer" => Value::from(1),
        "number" => Value::from(1.0),
        "boolean" => Value::Bool(true),
        "array" => Value::Array(vec![]),
        "null" => Value::Null,
        "object" => {
            let mut obj = Map::new();
            if let (Some(props), Some(req)) = (
                schema.get("properties").and_then(Value::as_object),
                schema.get("required").and_then(Value::as_array),
            ) {
                for r in req.iter().filter_map(Value::as_str) {
                    let s = props.get(r).cloned().unwrap_or(Value::Null);
                    obj.insert(r.to_string(), example_value(&s, r));
                }
            }
            Value::Object(obj)
        }
        _ => Value::String(format!("demo {name}")),
    }
}
