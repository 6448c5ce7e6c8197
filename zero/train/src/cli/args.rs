//! The command line and the `--config` file layered into one [`TrainConfig`]: flags given on
//! the command line win, then the file's keys, then the defaults.
//!
//! clap parses every flag into a [`TrainConfig`] (defaults filled in) and records which
//! flags the user typed; serde reads the file into another (defaults filled in, unknown keys
//! refused). [`TrainArgs::resolve`] starts from the file's and overwrites the typed flags.
//! Two defaults then depend on what the user set (typed flags and the file's keys, aliases
//! mapped to their fields): `--seq-len` left out is cut to an `--init-from` file's context,
//! and `--batch-size` left out is one micro-batch per local rank.

use crate::cli::config::TrainConfig;
use crate::error::ConfigError;
use clap::parser::ValueSource;
use clap::{Arg, ArgMatches, Args, Command, FromArgMatches};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use zero_gpt::GptConfig;

/// `zero-train`'s training flags: `--config FILE` and every [`TrainConfig`] flag.
#[derive(Debug, Clone, Default)]
pub struct TrainArgs {
    /// TOML file whose keys match the flags.
    pub config: Option<PathBuf>,
    /// Every flag's value, typed or default.
    pub flags: TrainConfig,
    /// Config keys (field names) of the flags typed on the command line.
    pub typed: Vec<String>,
}

const CONFIG: &str = "config";

impl Args for TrainArgs {
    fn augment_args(cmd: Command) -> Command {
        TrainConfig::augment_args(cmd.arg(config_arg()))
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        TrainConfig::augment_args_for_update(cmd.arg(config_arg()))
    }
}

fn config_arg() -> Arg {
    Arg::new(CONFIG)
        .long(CONFIG)
        .value_name("FILE")
        .value_parser(clap::value_parser!(PathBuf))
        .help(
            "TOML file of these flags, spelled with underscores (`zero_stage = 3`); flags \
             given on the command line win",
        )
}

impl FromArgMatches for TrainArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let typed = matches
            .ids()
            .map(|id| id.as_str())
            .filter(|id| *id != CONFIG)
            .filter(|id| matches.value_source(id) == Some(ValueSource::CommandLine))
            .map(str::to_string)
            .collect();
        Ok(Self {
            config: matches.get_one::<PathBuf>(CONFIG).cloned(),
            flags: TrainConfig::from_arg_matches(matches)?,
            typed,
        })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl TrainArgs {
    /// Reads a TOML file of flags over the defaults (unknown keys are errors, so typos do
    /// not pass silently).
    ///
    /// # Errors
    /// [`ConfigError::Read`] or [`ConfigError::Parse`].
    pub fn from_toml_file(path: &Path) -> Result<TrainConfig, ConfigError> {
        Self::read_toml_file(path).map(|(config, _)| config)
    }

    /// The config keys the user set: the typed flags and the `--config` file's keys.
    ///
    /// # Errors
    /// As [`TrainArgs::from_toml_file`].
    pub fn explicit_keys(&self) -> Result<Vec<String>, ConfigError> {
        let file_keys = match &self.config {
            Some(path) => Self::read_toml_file(path)?.1,
            None => Vec::new(),
        };
        Ok([file_keys, self.typed.clone()].concat())
    }

    /// The file's configuration and the keys it sets.
    fn read_toml_file(path: &Path) -> Result<(TrainConfig, Vec<String>), ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(crate::fsio::failed("read config file", path))?;
        let parse_error = |e: toml::de::Error| ConfigError::Parse {
            path: path.to_path_buf(),
            message: explain_toml_error(&text, &e),
        };
        let config = toml::from_str(&text).map_err(parse_error)?;
        let keys = toml::from_str::<toml::Table>(&text).map_err(parse_error)?;
        Ok((
            config,
            keys.keys().map(|k| field_of(k).to_string()).collect(),
        ))
    }

    /// Typed flags over the `--config` file (if any) over defaults, fitted to the
    /// `--init-from` file ([`crate::checkpoint::init::fit_to_file`]), validated; with the model it asks
    /// for ([`TrainConfig::validate`]).
    ///
    /// # Errors
    /// A [`ConfigError`] naming the file or the flag whose value is wrong.
    pub fn resolve(&self) -> Result<(TrainConfig, GptConfig), ConfigError> {
        let config = self.merge()?;
        let model = config.validate()?;
        Ok((config, model))
    }

    /// As [`TrainArgs::resolve`], without the checks of the whole configuration (each value
    /// still parses): for a caller that adjusts the configuration and validates it itself.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the file or the flag whose value cannot be read.
    pub fn merge(&self) -> Result<TrainConfig, ConfigError> {
        let (file, file_keys) = match &self.config {
            Some(path) => Self::read_toml_file(path)?,
            None => (TrainConfig::default(), Vec::new()),
        };
        let explicit = [file_keys, self.typed.clone()].concat();
        file.validate_reals()?;
        self.flags.validate_reals()?;
        let mut merged = to_map(&file)?;
        let flags = to_map(&self.flags)?;
        for key in &self.typed {
            if let Some(value) = flags.get(key) {
                merged.insert(key.clone(), value.clone());
            }
        }
        let mut config: TrainConfig = serde_json::from_value(Value::Object(merged))
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        crate::checkpoint::init::fit_to_file(&mut config, &explicit)?;
        derive_batch_size(&mut config, &explicit);
        Ok(config)
    }
}

/// A global batch left out is one micro-batch per data-parallel rank (DeepSpeed derives
/// `train_batch_size` the same way), when the world size is known here: with the local
/// backend. A launcher's ranks learn it only once joined, so they keep the default, which
/// must then divide into them.
fn derive_batch_size(config: &mut TrainConfig, explicit: &[String]) {
    let given = explicit.iter().any(|k| k == "batch_size");
    if !given && config.backend == crate::cli::config::Backend::Local {
        config.batch_size = config.one_micro_batch_per_rank();
    }
}

/// The DeepSpeed spellings `TrainConfig` accepts for its keys (its `serde(alias)`
/// attributes), each with the field it sets.
const ALIASES: [(&str, &str); 5] = [
    ("train_batch_size", "batch_size"),
    ("train_micro_batch_size_per_gpu", "micro_batch_size"),
    ("gradient_clipping", "grad_clip"),
    ("stage", "zero_stage"),
    ("prefetch", "prefetch_units"),
];

/// The field a config file's `key` sets.
fn field_of(key: &str) -> &str {
    ALIASES
        .iter()
        .find(|(alias, _)| *alias == key)
        .map_or(key, |(_, field)| field)
}

/// toml's message, or for an unknown key one line naming the line and the key meant: toml
/// lists every key there is, and a flag's spelling (`zero-stage`) is the likely slip.
fn explain_toml_error(text: &str, err: &toml::de::Error) -> String {
    let unknown = err
        .message()
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split('`').next());
    let Some(key) = unknown else {
        return err.to_string();
    };
    let line = err
        .span()
        .and_then(|s| text.get(..s.start))
        .map_or(1, |before| before.matches('\n').count() + 1);
    let known: Vec<String> = to_map(&TrainConfig::default())
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    let meant = closest_key(
        key,
        known.iter().map(String::as_str).chain(ALIASES.map(|a| a.0)),
    );
    let hint = meant.map_or(String::new(), |k| format!(" (did you mean `{k}`?)"));
    format!("line {line}: unknown key `{key}`{hint}; keys are the flags spelled with underscores")
}

/// The known key nearest to `key` (underscores for dashes, then by edit distance up to 3).
fn closest_key<'a>(key: &str, known: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let key = key.replace('-', "_").to_ascii_lowercase();
    known
        .map(|k| (edit_distance(&key, k), k))
        .filter(|(d, _)| *d <= 3)
        .min()
        .map(|(_, k)| k)
}

/// Levenshtein distance between two short ASCII keys.
fn edit_distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

/// `value` as a JSON map, keyed by field name.
fn to_map(value: &TrainConfig) -> Result<Map<String, Value>, ConfigError> {
    match serde_json::to_value(value) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(ConfigError::Invalid(format!(
            "expected a table, got {other}"
        ))),
        Err(e) => Err(ConfigError::Invalid(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::{closest_key, edit_distance, to_map, ALIASES};
    use crate::cli::config::TrainConfig;

    #[test]
    fn edit_distance_counts_single_character_edits() {
        for (a, b, d) in [
            ("", "", 0),
            ("abc", "abc", 0),
            ("abc", "abd", 1),
            ("abc", "ab", 1),
            ("ab", "abc", 1),
            ("kitten", "sitting", 3),
            ("", "four", 4),
        ] {
            assert_eq!(edit_distance(a, b), d, "{a:?} {b:?}");
        }
    }

    #[test]
    fn a_flag_spelling_or_a_typo_finds_the_key_meant() {
        let known = ["zero_stage", "steps", "seq_len", "micro_batch_size"];
        assert_eq!(
            closest_key("zero-stage", known.into_iter()),
            Some("zero_stage")
        );
        assert_eq!(closest_key("step", known.into_iter()), Some("steps"));
        assert_eq!(
            closest_key("Micro-Batch-Size", known.into_iter()),
            Some("micro_batch_size")
        );
        assert_eq!(
            closest_key("learning_rate_schedule", known.into_iter()),
            None
        );
    }

    /// Each alias sets the field the table names and no other: a value unlike the default,
    /// read through serde, changes exactly that field.
    #[test]
    fn each_alias_sets_the_field_it_is_listed_for() {
        let defaults = to_map(&TrainConfig::default()).unwrap();
        for (alias, field) in ALIASES {
            let value = if field == "grad_clip" { "0.25" } else { "3" };
            let config: TrainConfig = toml::from_str(&format!("{alias} = {value}")).unwrap();
            let map = to_map(&config).unwrap();
            let changed: Vec<&String> = map.keys().filter(|k| map[*k] != defaults[*k]).collect();
            assert_eq!(changed, [field], "{alias}");
        }
    }
}
