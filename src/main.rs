//! `policy-serve`: a thin CLI over the library. Output formats are a contract other tools
//! rely on: `render` prints exactly the prompt, `parse` one JSON object. Exit code 0 on
//! success, 2 on bad usage or bad input (reason on stderr), 1 when running failed.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod cli;

use clap::{Parser, Subcommand};
use cli::{EngineArgs, run_episode, write_npy};
use policy_serve::engine::{WorkerOptions, run_worker};
use policy_serve::policy::format::{
    ChatTemplate, Message, RenderOptions, ToolDefinition, parse_output,
};
use policy_serve::registry::resolve_files;
use policy_serve::{
    EpisodeConfig, Error, GenerationRequest, ModelRegistry, ModelSource, ModelSpec,
    OutputConstraint, SamplingParams, ToolChoice, TranscriptMode,
};

#[derive(Parser)]
#[command(
    name = "policy-serve",
    version,
    about = "Serve tool-calling Qwen3 policies: list models, render prompts, parse tool calls, run episodes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the registry's models (demo first).
    Models {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Render a conversation with a model's own chat template; prints exactly the prompt.
    Render {
        /// Model directory holding tokenizer_config.json (or chat_template.jinja).
        #[arg(long)]
        model_dir: PathBuf,
        /// JSON list of messages, as HF takes them.
        #[arg(long)]
        messages: PathBuf,
        /// JSON list of tools (OpenAI/TRL function schema).
        #[arg(long)]
        tools: Option<PathBuf>,
        /// Pass enable_thinking (alone: true; `--enable-thinking false`: false; absent: undefined, as HF).
        #[arg(long, num_args = 0..=1, default_missing_value = "true")]
        enable_thinking: Option<bool>,
        /// Leave out the assistant header at the end.
        #[arg(long)]
        no_generation_prompt: bool,
    },
    /// Parse raw model output from stdin; prints {"calls", "content", "error"}.
    Parse {
        /// JSON list of tools to validate the calls against.
        #[arg(long)]
        tools: Option<PathBuf>,
    },
    /// Run one episode against a built-in echo environment and print each step.
    Episode {
        /// Model key (see `models`); the demo needs no download.
        #[arg(long, default_value = "demo")]
        model: String,
        /// The task (first user message).
        #[arg(long)]
        task: String,
        /// JSON list of tools.
        #[arg(long)]
        tools: PathBuf,
        /// System prompt.
        #[arg(long)]
        system: Option<String>,
        /// Use this local directory for the model key.
        #[arg(long)]
        model_dir: Option<PathBuf>,
        /// Most steps.
        #[arg(long, default_value_t = 8)]
        max_steps: usize,
        /// Most tokens per step.
        #[arg(long, default_value_t = 256)]
        max_new_tokens: usize,
        /// Sampling temperature (0: greedy).
        #[arg(long)]
        temperature: Option<f32>,
        /// Sampling seed.
        #[arg(long)]
        seed: Option<u64>,
        /// Append-only transcript: reuse every earlier token from the prefix cache.
        #[arg(long)]
        append_only: bool,
        /// Constrain every answer: `auto` (text or valid calls), `required` (valid calls
        /// only), `none` (text only) or a tool's name (that call). Model policies only.
        #[arg(long, value_name = "CHOICE")]
        tool_choice: Option<String>,
        /// A PEFT LoRA adapter directory to run through (over the model).
        #[arg(long)]
        adapter: Option<PathBuf>,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Generate from a raw prompt with a local model directory.
    Generate {
        /// Model directory (HF layout).
        #[arg(long)]
        model_dir: PathBuf,
        /// Prompt text (used as is; render it first for chat).
        #[arg(long)]
        prompt: String,
        /// Most new tokens.
        #[arg(long, default_value_t = 64)]
        max_new_tokens: usize,
        /// Temperature (0: greedy).
        #[arg(long, default_value_t = 0.0)]
        temperature: f32,
        /// Seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// A PEFT LoRA adapter directory to run through (over the model).
        #[arg(long)]
        adapter: Option<PathBuf>,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Run rank N (> 0) of a tensor-parallel model, driven by the head over NCCL.
    Worker {
        /// This rank (1..world-size).
        #[arg(long)]
        rank: usize,
        /// Model key (see `models`).
        #[arg(long)]
        model: String,
        /// Use this local directory for the model key.
        #[arg(long)]
        model_dir: Option<PathBuf>,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Write f32 logits of every position of a token list as a .npy file [len, vocab].
    Logits {
        /// Model directory (HF layout).
        #[arg(long)]
        model_dir: PathBuf,
        /// Comma-separated token ids.
        #[arg(long, value_delimiter = ',')]
        ids: Vec<u32>,
        /// Output .npy path.
        #[arg(long)]
        out: PathBuf,
        /// Write only the last N positions (long prompts: all rows of a 16k prompt are 10 GB).
        #[arg(long)]
        last: Option<usize>,
        /// A PEFT LoRA adapter directory to run through (over the model).
        #[arg(long)]
        adapter: Option<PathBuf>,
        #[command(flatten)]
        engine: EngineArgs,
    },
}

fn main() -> ExitCode {
    policy_serve::init_logging("warn");
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            match e {
                Error::Engine(_) | Error::EngineStopped | Error::Candle(_) => ExitCode::from(1),
                _ => ExitCode::from(2),
            }
        }
    }
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path, what: &str) -> Result<T, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::InvalidInput(format!("{}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| Error::InvalidInput(format!("{}: not a valid {what}: {e}", path.display())))
}

fn read_tools(path: &Path) -> Result<Vec<ToolDefinition>, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::InvalidInput(format!("{}: {e}", path.display())))?;
    ToolDefinition::list_from_json(&text)
        .map_err(|e| Error::InvalidInput(format!("{}: {e}", path.display())))
}

/// A registry of the model in `dir` (key `local`) and, with `adapter`, a LoRA adapter over it
/// (key `adapter`); returns it and the key to run.
fn local_registry(
    dir: &Path,
    engine: &EngineArgs,
    adapter: Option<&Path>,
) -> Result<(ModelRegistry, &'static str), Error> {
    let opts = engine.options_for("local", &ModelSource::Local(dir.to_path_buf()))?;
    let registry =
        ModelRegistry::new(vec![ModelSpec::local("local", "Local model", dir)])?.with_options(opts);
    Ok(match adapter {
        Some(a) => (
            registry.with_model(ModelSpec::adapter(
                "adapter",
                "LoRA adapter",
                "local",
                ModelSource::Local(a.to_path_buf()),
            )),
            "adapter",
        ),
        None => (registry, "local"),
    })
}

fn run(command: Command) -> Result<(), Error> {
    match command {
        Command::Models { json } => {
            let r = ModelRegistry::with_defaults();
            if json {
                let list: Vec<_> = r
                    .specs()
                    .map(|s| serde_json::json!({"key": s.key, "label": s.label, "source": s.source.to_string(), "thinking": s.enable_thinking, "available": s.available}))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                println!(
                    "{:<24} {:<40} {:<40} {:<8} AVAILABLE",
                    "KEY", "LABEL", "SOURCE", "THINKING"
                );
                for s in r.specs() {
                    println!(
                        "{:<24} {:<40} {:<40} {:<8} {}",
                        s.key,
                        s.label,
                        s.source.to_string(),
                        s.enable_thinking,
                        if s.available { "yes" } else { "coming soon" }
                    );
                }
            }
        }
        Command::Render {
            model_dir,
            messages,
            tools,
            enable_thinking,
            no_generation_prompt,
        } => {
            let template = ChatTemplate::from_model_dir(&model_dir)?;
            let messages: Vec<Message> = read_json(&messages, "JSON list of messages")?;
            let tools = tools.as_deref().map(read_tools).transpose()?;
            let opts = RenderOptions {
                add_generation_prompt: !no_generation_prompt,
                enable_thinking,
            };
            print!("{}", template.render(&messages, tools.as_deref(), opts)?);
        }
        Command::Parse { tools } => {
            let tools = tools.as_deref().map(read_tools).transpose()?;
            let mut raw = String::new();
            std::io::stdin()
                .read_to_string(&mut raw)
                .map_err(|e| Error::InvalidInput(format!("stdin is not UTF-8 text: {e}")))?;
            let p = parse_output(&raw, tools.as_deref());
            println!(
                "{}",
                serde_json::json!({"calls": p.calls, "content": p.content, "error": p.error})
            );
        }
        Command::Episode {
            model,
            task,
            tools,
            system,
            model_dir,
            max_steps,
            max_new_tokens,
            temperature,
            seed,
            append_only,
            tool_choice,
            adapter,
            engine,
        } => {
            let tools = read_tools(&tools)?;
            let mut registry = ModelRegistry::with_defaults();
            if let Some(dir) = model_dir {
                registry = registry.with_local_dir(&model, dir)?;
            }
            let spec = registry.spec(&model)?.clone();
            if !spec.is_demo() {
                registry = registry.with_options(engine.options_for(&model, &spec.source)?);
            }
            let mut model = model;
            if let Some(dir) = adapter {
                let key = format!("{model}+adapter");
                registry = registry.with_model(
                    ModelSpec::adapter(&key, &key, &model, ModelSource::Local(dir))
                        .thinking(spec.enable_thinking),
                );
                model = key;
            }
            let episode = EpisodeConfig {
                system_prompt: system,
                tools,
                max_new_tokens: Some(max_new_tokens),
                temperature,
                top_p: None,
                max_transcript_tokens: None,
                seed,
                transcript_mode: if append_only {
                    TranscriptMode::AppendOnly
                } else {
                    TranscriptMode::Template
                },
                constraint: tool_choice.map(|c| {
                    OutputConstraint::tools(match c.as_str() {
                        "auto" => ToolChoice::Auto,
                        "required" => ToolChoice::Required,
                        "none" => ToolChoice::None,
                        name => ToolChoice::Function(name.to_string()),
                    })
                }),
            };
            let mut policy = registry.get_policy(&model, episode)?;
            let outcome = run_episode(policy.as_mut(), task, max_steps);
            if let Ok(m) = registry.model(&model) {
                println!("engine: {}", serde_json::to_string(&m.engine().stats())?);
            }
            outcome?;
        }
        Command::Worker {
            rank,
            model,
            model_dir,
            engine,
        } => {
            let addr = engine.rendezvous.ok_or_else(|| {
                Error::InvalidInput("a worker needs --rendezvous HOST:PORT (the head's)".into())
            })?;
            if rank == 0 || rank >= engine.world_size {
                return Err(Error::InvalidInput(format!(
                    "--rank {rank}: workers are ranks 1..{} (rank 0 is the head)",
                    engine.world_size
                )));
            }
            let mut registry = ModelRegistry::with_defaults();
            if let Some(dir) = model_dir {
                registry = registry.with_local_dir(&model, dir)?;
            }
            let files = resolve_files(&model, &registry.spec(&model)?.source)?;
            let link = engine.nccl_link(rank, addr)?;
            let opts = WorkerOptions {
                engine: engine.options()?,
                fail_command: None,
            };
            let report = run_worker(&files, &opts, link.0)?;
            eprintln!("worker rank {rank} stopped: {report:?}");
        }
        Command::Generate {
            model_dir,
            prompt,
            max_new_tokens,
            temperature,
            seed,
            adapter,
            engine,
        } => {
            let (registry, key) = local_registry(&model_dir, &engine, adapter.as_deref())?;
            let model = registry.model(key)?;
            let e = model.engine();
            let ids = e.tokenize(&prompt)?;
            let sampling = SamplingParams {
                temperature,
                top_k: None,
                top_p: None,
                min_p: None,
                seed,
            };
            let mut request = GenerationRequest::new(ids)
                .max_new_tokens(max_new_tokens)
                .sampling(sampling);
            request.adapter = model.adapter();
            let g = e.generate(request)?;
            println!("{}", g.text);
            eprintln!(
                "[{:?}; prompt {} tok, generated {} tok in {:.1} ms; first token {:.1} ms] engine: {}",
                g.finish_reason,
                g.prompt_tokens,
                g.generated_tokens,
                g.total_time.as_secs_f64() * 1e3,
                g.time_to_first_token.as_secs_f64() * 1e3,
                serde_json::to_string(&e.stats())?
            );
        }
        Command::Logits {
            model_dir,
            ids,
            out,
            last,
            adapter,
            engine,
        } => {
            if ids.is_empty() {
                return Err(Error::InvalidInput(
                    "--ids needs at least one token id".into(),
                ));
            }
            let (registry, key) = local_registry(&model_dir, &engine, adapter.as_deref())?;
            let model = registry.model(key)?;
            let mut rows = model.engine().logits_with(ids, model.adapter().as_ref())?;
            if let Some(n) = last {
                rows.drain(..rows.len().saturating_sub(n));
            }
            write_npy(&out, &rows)?;
            eprintln!(
                "wrote {} x {} f32 logits to {}",
                rows.len(),
                rows.first().map_or(0, Vec::len),
                out.display()
            );
        }
    }
    Ok(())
}
