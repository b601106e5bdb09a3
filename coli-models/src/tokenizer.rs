//! Text ↔ ids through `tokenizer.json` (the `tokenizers` crate), with the chat
//! template and special tokens of `tokenizer_config.json` (rendering is in
//! [`crate::chat_template`]).

use std::path::Path;
use std::sync::OnceLock;

use serde_json::Value;

pub use crate::chat_template::ChatMessage;
use crate::chat_template::{ChatRequest, ChatTemplate, SpecialTokens};
use crate::error::{ModelError, Result};

/// A tokenizer with its chat templates and special tokens.
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    templates: Vec<NamedTemplate>,
    /// One unnamed template (`chat_template.jinja` or a string in `tokenizer_config.json`).
    single_template: bool,
    special: SpecialTokens,
}

/// One of a model's chat templates, compiled on first use (a template that does not
/// compile fails the render, not the load).
struct NamedTemplate {
    name: String,
    source: String,
    compiled: OnceLock<std::result::Result<ChatTemplate, String>>,
}

impl NamedTemplate {
    fn new(name: &str, source: String) -> NamedTemplate {
        NamedTemplate {
            name: name.to_string(),
            source,
            compiled: OnceLock::new(),
        }
    }
}

/// A model's chat templates as transformers finds them: `chat_template.jinja` and
/// `additional_chat_templates/NAME.jinja` when present, else `tokenizer_config.json`'s
/// `chat_template` (one string, or a list of `{name, template}`).
fn find_templates(dir: &Path, cfg: &Value) -> Result<(Vec<NamedTemplate>, bool)> {
    let read = |path: &Path| {
        std::fs::read_to_string(path)
            .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))
    };
    let mut files = Vec::new();
    let main = dir.join("chat_template.jinja");
    if main.is_file() {
        files.push(NamedTemplate::new("default", read(&main)?));
    }
    if let Ok(entries) = std::fs::read_dir(dir.join("additional_chat_templates")) {
        let mut paths: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for path in paths {
            if let (Some(name), Some("jinja")) = (
                path.file_stem().and_then(|n| n.to_str()),
                path.extension().and_then(|x| x.to_str()),
            ) {
                files.push(NamedTemplate::new(name, read(&path)?));
            }
        }
    }
    if !files.is_empty() {
        let single = files.len() == 1 && files[0].name == "default";
        return Ok((files, single));
    }
    Ok(match cfg.get("chat_template") {
        Some(Value::String(s)) => (vec![NamedTemplate::new("default", s.clone())], true),
        Some(Value::Array(list)) => {
            let named = list.iter().filter_map(|t| {
                let name = t.get("name")?.as_str()?;
                Some(NamedTemplate::new(
                    name,
                    t.get("template")?.as_str()?.to_string(),
                ))
            });
            (named.collect(), false)
        }
        _ => (Vec::new(), false),
    })
}

impl TextTokenizer {
    /// Loads `tokenizer.json` (required) and `tokenizer_config.json` (optional) from `dir`.
    /// For a GGUF file, `tokenizer.json`/`tokenizer_config.json` beside it win; else the
    /// tokenizer and the chat template come from its `tokenizer.*` metadata.
    pub fn load(dir: &Path) -> Result<TextTokenizer> {
        if let Some(file) = coli_core::model_dir::model_gguf(dir)? {
            let beside = file.parent().unwrap_or(Path::new("."));
            if beside.join("tokenizer.json").is_file() {
                return TextTokenizer::load(beside);
            }
            return TextTokenizer::from_gguf(&file);
        }
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(ModelError::Tokenizer(format!(
                "{} not found (pass --prompt-ids to run without a tokenizer)",
                path.display()
            )));
        }
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: Value = match std::fs::read_to_string(&cfg_path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| {
                ModelError::Tokenizer(format!("{}: not valid JSON: {e}", cfg_path.display()))
            })?,
            Err(_) => Value::Null,
        };
        let (templates, single_template) = find_templates(dir, &cfg)?;
        // transformers also reads special_tokens_map.json; tokenizer_config.json wins.
        let map: Value = std::fs::read_to_string(dir.join("special_tokens_map.json"))
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or(Value::Null);
        let special = SpecialTokens::from_config(&cfg).or(SpecialTokens::from_config(&map));
        Ok(TextTokenizer {
            inner,
            templates,
            single_template,
            special,
        })
    }

    /// [`TextTokenizer::load`] when the model carries a tokenizer (`tokenizer.json`, or a
    /// GGUF's `tokenizer.ggml.tokens`); `None` when it has none (ids-only fixtures).
    pub fn load_if_present(dir: &Path) -> Result<Option<TextTokenizer>> {
        let present = match coli_core::model_dir::model_gguf(dir)? {
            Some(file) => {
                let beside = file.parent().unwrap_or(Path::new("."));
                beside.join("tokenizer.json").is_file()
                    || coli_core::gguf::GgufFile::open(&file)?
                        .metadata
                        .contains_key("tokenizer.ggml.tokens")
            }
            None => dir.join("tokenizer.json").is_file(),
        };
        present.then(|| TextTokenizer::load(dir)).transpose()
    }

    /// The tokenizer of a GGUF's metadata (byte-level BPE, `tokenizer.ggml.model =
    /// "gpt2"`), with its special tokens and chat template.
    fn from_gguf(path: &Path) -> Result<TextTokenizer> {
        let f = coli_core::gguf::GgufFile::open(path)?;
        let json = crate::gguf_import::tokenizer_json(&f)?;
        let max_len = f
            .metadata
            .iter()
            .find(|(k, _)| k.ends_with(".context_length"))
            .and_then(|(_, v)| v.as_u64())
            .map_or(Value::Null, Value::from);
        let cfg = crate::gguf_import::tokenizer_config(&f, &max_len)?;
        let inner =
            tokenizers::Tokenizer::from_bytes(json.to_string().as_bytes()).map_err(|e| {
                ModelError::Tokenizer(format!("{}: tokenizer metadata: {e}", path.display()))
            })?;
        let (templates, single_template) = find_templates(path, &cfg)?; // no template files inside a file
        Ok(TextTokenizer {
            inner,
            templates,
            single_template,
            special: SpecialTokens::from_config(&cfg),
        })
    }

    /// Text to ids. Special tokens written in the text (e.g. `<|im_start|>`) are recognised.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Ids to text.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))
    }

    /// The id of a token string, if it exists.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The raw bytes each token id stands for (for grammar masks): GPT-2 byte-level
    /// tokens are mapped back through the byte alphabet, SentencePiece byte tokens
    /// `<0xNN>` become that byte and `▁` a space; special (added) tokens get no bytes, so a
    /// grammar never allows them.
    pub fn token_bytes(&self) -> Vec<Vec<u8>> {
        let n = self.inner.get_vocab_size(true);
        let vocab = self.inner.get_vocab(true);
        let byte_level = vocab.keys().any(|t| t.starts_with('\u{120}'));
        let special: std::collections::HashSet<u32> = self
            .inner
            .get_added_tokens_decoder()
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(&id, _)| id)
            .collect();
        // GPT-2's bytes_to_unicode, inverted.
        let mut inverse = std::collections::HashMap::new();
        let mut extra = 0u32;
        for b in 0u32..256 {
            let printable = (0x21..=0x7E).contains(&b)
                || (0xA1..=0xAC).contains(&b)
                || (0xAE..=0xFF).contains(&b);
            let c = if printable {
                b
            } else {
                extra += 1;
                255 + extra
            };
            inverse.insert(char::from_u32(c).expect("code point"), b as u8);
        }
        let mut out = vec![Vec::new(); n];
        for (tok, &id) in &vocab {
            if special.contains(&id) || id as usize >= n {
                continue;
            }
            out[id as usize] =
                if let Some(hex) = tok.strip_prefix("<0x").and_then(|t| t.strip_suffix('>')) {
                    u8::from_str_radix(hex, 16)
                        .map(|b| vec![b])
                        .unwrap_or_default()
                } else if byte_level {
                    tok.chars()
                        .map(|c| inverse.get(&c).copied())
                        .collect::<Option<Vec<u8>>>()
                        .unwrap_or_default()
                } else {
                    tok.replace('\u{2581}', " ").into_bytes()
                };
        }
        out
    }

    /// The end-of-sequence token of `tokenizer_config.json`, as an id.
    pub fn eos_id(&self) -> Option<u32> {
        self.special
            .eos_token
            .as_deref()
            .and_then(|t| self.token_id(t))
    }

    /// Whether a chat template is available.
    pub fn has_chat_template(&self) -> bool {
        !self.templates.is_empty()
    }

    /// The chat template used without tools, as the model directory spells it.
    pub fn chat_template(&self) -> Option<&str> {
        self.select_template(false).ok().map(|t| t.source.as_str())
    }

    /// The chat template used for a request with (`tools = true`) or without tools: a
    /// model may ship a separate `tool_use` template.
    pub fn chat_template_for(&self, tools: bool) -> Option<&str> {
        self.select_template(tools).ok().map(|t| t.source.as_str())
    }

    /// The special tokens passed to the chat template.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    /// transformers' `get_chat_template`: the only template, else `tool_use` when tools
    /// are given and it exists, else `default`.
    fn select_template(&self, tools: bool) -> Result<&NamedTemplate> {
        let by_name = |name: &str| self.templates.iter().find(|t| t.name == name);
        if self.single_template {
            return Ok(&self.templates[0]);
        }
        if self.templates.is_empty() {
            return Err(ModelError::Template(
                "the model has no chat template (tokenizer_config.json or chat_template.jinja)"
                    .into(),
            ));
        }
        tools
            .then(|| by_name("tool_use"))
            .flatten()
            .or_else(|| by_name("default"))
            .ok_or_else(|| {
                let names: Vec<&str> = self.templates.iter().map(|t| t.name.as_str()).collect();
                ModelError::Template(format!(
                    "the model has several chat templates ({}) and none is named \"default\"",
                    names.join(", ")
                ))
            })
    }

    /// Renders the chat template over `req` as transformers' `apply_chat_template` would.
    pub fn render_chat(&self, req: &ChatRequest) -> Result<String> {
        let named = self.select_template(req.tools.is_some())?;
        let compiled = named.compiled.get_or_init(|| {
            ChatTemplate::new(&named.source).map_err(|e| match e {
                ModelError::Template(msg) => msg,
                other => other.to_string(),
            })
        });
        match compiled {
            Ok(template) => template.render(&self.special, req),
            Err(e) => Err(ModelError::Template(e.clone())),
        }
    }

    /// Renders the chat template over typed `messages`, without tools or extra kwargs.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let messages: Vec<Value> = messages.iter().map(ChatMessage::to_value).collect();
        self.render_chat(&ChatRequest {
            messages: &messages,
            tools: None,
            add_generation_prompt,
            extra: &serde_json::Map::new(),
        })
    }

    /// An incremental decoder for streaming output.
    pub fn stream(&self) -> TokenStream<'_> {
        TokenStream {
            inner: self.inner.decode_stream(true),
        }
    }
}

/// Incremental detokenization: yields only complete UTF-8 text, in constant time per token.
pub struct TokenStream<'t> {
    inner: tokenizers::DecodeStream<
        't,
        tokenizers::ModelWrapper,
        tokenizers::NormalizerWrapper,
        tokenizers::PreTokenizerWrapper,
        tokenizers::PostProcessorWrapper,
        tokenizers::DecoderWrapper,
    >,
}

impl TokenStream<'_> {
    /// Adds a token; returns newly completed text (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        let piece = self
            .inner
            .step(id)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        Ok(piece.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKENIZER: &str = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
        "normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":null,
        "model":{"type":"WordLevel","vocab":{"a":0},"unk_token":"a"}}"#;

    fn model_dir(config: Value, files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), TOKENIZER).unwrap();
        std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
        for (name, text) in files {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        dir
    }

    fn render(tok: &TextTokenizer, tools: bool) -> Result<String> {
        let tool = [serde_json::json!({"type": "function", "function": {"name": "f"}})];
        tok.render_chat(&ChatRequest {
            messages: &[],
            tools: tools.then_some(&tool[..]),
            add_generation_prompt: false,
            extra: &serde_json::Map::new(),
        })
    }

    /// Template lookup follows transformers: `chat_template.jinja` wins over
    /// tokenizer_config.json; named templates pick `tool_use` for tools, else `default`.
    #[test]
    fn chat_templates_are_found_and_chosen_like_transformers() {
        let cfg = serde_json::json!({"chat_template": "config", "eos_token": {"content": "</s>"}});
        let tok = TextTokenizer::load(model_dir(cfg.clone(), &[]).path()).unwrap();
        assert_eq!(render(&tok, true).unwrap(), "config");
        assert_eq!(tok.special_tokens().eos_token.as_deref(), Some("</s>"));

        let dir = model_dir(cfg, &[("chat_template.jinja", "file{{ eos_token }}")]);
        let tok = TextTokenizer::load(dir.path()).unwrap();
        assert_eq!(render(&tok, false).unwrap(), "file</s>");

        let named = serde_json::json!({"chat_template": [
            {"name": "default", "template": "plain"},
            {"name": "tool_use", "template": "tools:{{ tools[0].function.name }}"},
        ]});
        let tok = TextTokenizer::load(model_dir(named, &[]).path()).unwrap();
        assert_eq!(render(&tok, false).unwrap(), "plain");
        assert_eq!(render(&tok, true).unwrap(), "tools:f");
        assert_eq!(tok.chat_template(), Some("plain"));
        assert_eq!(
            tok.chat_template_for(true),
            Some("tools:{{ tools[0].function.name }}")
        );

        let dir = model_dir(
            serde_json::json!({}),
            &[("additional_chat_templates/rag.jinja", "rag")],
        );
        let tok = TextTokenizer::load(dir.path()).unwrap();
        let err = render(&tok, false).unwrap_err().to_string();
        assert!(err.contains("(rag)") && err.contains("default"), "{err}");

        let tok = TextTokenizer::load(model_dir(serde_json::json!({}), &[]).path()).unwrap();
        assert!(!tok.has_chat_template());
        assert!(render(&tok, false).is_err());
    }
}
