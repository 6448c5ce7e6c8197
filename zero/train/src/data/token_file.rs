//! llm.c token files: a header of 256 little-endian int32 (magic 20240520, version 1, token
//! count, the rest zero), then the tokens as little-endian uint16.
//!
//! Files are a few MB, so they are read whole into memory; `memmap2` would save the copy
//! but is not a dependency of this crate and buys nothing at this size.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::error::{DataError, Result, TokenFileError};
use crate::fsio::{failed, read_up_to};

/// Magic number in the first header word of a token file.
pub const TOKEN_MAGIC: i32 = 20_240_520;
/// The token-file version this crate reads and writes (uint16 tokens).
pub const TOKEN_VERSION: i32 = 1;
/// Number of int32 words in the header.
pub const HEADER_INTS: usize = crate::llmc_header::HEADER_WORDS;
/// Header size in bytes.
pub const HEADER_BYTES: usize = crate::llmc_header::HEADER_BYTES;
/// Vocabulary size of the GPT-2 BPE.
pub const GPT2_VOCAB: u32 = 50_257;
/// GPT-2's `<|endoftext|>` token, which separates documents.
pub const GPT2_EOT: u16 = 50_256;

/// The tokens of one llm.c token file, validated and held in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenFile {
    tokens: Vec<u16>,
}

fn memory_path() -> PathBuf {
    PathBuf::from("<memory>")
}

fn format_err(path: &Path, source: TokenFileError) -> DataError {
    DataError::Format {
        path: path.to_path_buf(),
        source,
    }
}

/// Parses and checks the header; returns the token count.
fn parse_header(header: &[u8]) -> Result<u64, TokenFileError> {
    if header.len() < HEADER_BYTES {
        return Err(TokenFileError::TruncatedHeader {
            expected: HEADER_BYTES,
            got: header.len(),
        });
    }
    let word = |i: usize| crate::llmc_header::word(header, i);
    let magic = word(0);
    if magic != TOKEN_MAGIC {
        return Err(TokenFileError::BadMagic {
            expected: TOKEN_MAGIC,
            found: magic,
        });
    }
    let version = word(1);
    if version != TOKEN_VERSION {
        return Err(TokenFileError::BadVersion {
            supported: TOKEN_VERSION,
            found: version,
        });
    }
    let count = word(2);
    u64::try_from(count).map_err(|_| TokenFileError::NegativeCount { count })
}

fn decode_tokens(payload: &[u8], vocab: u32) -> Result<Vec<u16>, TokenFileError> {
    let tokens: Vec<u16> = payload
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect();
    if let Some((index, &token)) = tokens
        .iter()
        .enumerate()
        .find(|(_, &t)| u32::from(t) >= vocab)
    {
        return Err(TokenFileError::TokenOutOfRange {
            index,
            token,
            vocab,
        });
    }
    Ok(tokens)
}

fn check_payload_len(count: u64, payload_bytes: u64) -> Result<(), TokenFileError> {
    // count < 2^31, so this cannot overflow.
    let expected_bytes = count * 2;
    if payload_bytes != expected_bytes {
        return Err(TokenFileError::CountMismatch {
            header_tokens: count,
            expected_bytes,
            payload_bytes,
        });
    }
    Ok(())
}

impl TokenFile {
    /// Wraps tokens already in memory (checked against the GPT-2 vocabulary).
    ///
    /// # Errors
    /// [`DataError::Format`] if a token is `>= GPT2_VOCAB` or there are more than `i32::MAX`.
    pub fn from_tokens(tokens: Vec<u16>) -> Result<Self> {
        Self::from_tokens_with_vocab(tokens, GPT2_VOCAB)
    }

    /// Wraps tokens already in memory, checked against `vocab`.
    ///
    /// # Errors
    /// [`DataError::Format`] if a token is `>= vocab` or there are more than `i32::MAX`.
    pub fn from_tokens_with_vocab(tokens: Vec<u16>, vocab: u32) -> Result<Self> {
        if i32::try_from(tokens.len()).is_err() {
            return Err(format_err(
                &memory_path(),
                TokenFileError::TooManyTokens {
                    count: tokens.len(),
                },
            ));
        }
        if let Some((index, &token)) = tokens
            .iter()
            .enumerate()
            .find(|(_, &t)| u32::from(t) >= vocab)
        {
            return Err(format_err(
                &memory_path(),
                TokenFileError::TokenOutOfRange {
                    index,
                    token,
                    vocab,
                },
            ));
        }
        Ok(Self { tokens })
    }

    /// Opens and validates a token file, checking tokens against the GPT-2 vocabulary.
    ///
    /// # Errors
    /// [`DataError::Io`] if the file cannot be opened or read; [`DataError::Format`] naming the file
    /// if it is truncated, foreign (magic), of another version, disagrees with its count, or
    /// holds a token outside the vocabulary.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with_vocab(path, GPT2_VOCAB)
    }

    /// [`TokenFile::open`] with an explicit vocabulary size.
    ///
    /// # Errors
    /// As [`TokenFile::open`].
    pub fn open_with_vocab(path: impl AsRef<Path>, vocab: u32) -> Result<Self> {
        let path = path.as_ref();
        let mut file = File::open(path).map_err(failed("open", path))?;
        let mut header = vec![0u8; HEADER_BYTES];
        let got = read_up_to(&mut file, &mut header).map_err(failed("read", path))?;
        let count = parse_header(&header[..got]).map_err(|e| format_err(path, e))?;
        // Check the size against the header before allocating for the payload.
        let file_len = file.metadata().map_err(failed("stat", path))?.len();
        let payload_bytes = file_len.saturating_sub(HEADER_BYTES as u64);
        check_payload_len(count, payload_bytes).map_err(|e| format_err(path, e))?;
        let mut payload = Vec::with_capacity(usize::try_from(payload_bytes).unwrap_or(0));
        file.read_to_end(&mut payload)
            .map_err(failed("read", path))?;
        // The file may have changed between stat and read; check again.
        check_payload_len(count, payload.len() as u64).map_err(|e| format_err(path, e))?;
        let tokens = decode_tokens(&payload, vocab).map_err(|e| format_err(path, e))?;
        Ok(Self { tokens })
    }

    /// Parses a whole token file held in memory (the path the fuzz target drives).
    ///
    /// # Errors
    /// [`DataError::Format`] (with path `<memory>`) as for [`TokenFile::open`].
    pub fn from_bytes(bytes: &[u8], vocab: u32) -> Result<Self> {
        let count = parse_header(bytes).map_err(|e| format_err(&memory_path(), e))?;
        let payload = &bytes[HEADER_BYTES..];
        check_payload_len(count, payload.len() as u64)
            .map_err(|e| format_err(&memory_path(), e))?;
        let tokens = decode_tokens(payload, vocab).map_err(|e| format_err(&memory_path(), e))?;
        Ok(Self { tokens })
    }

    /// Parses a token file from a stream, reading at most one byte past what the header
    /// announces; memory grows with the bytes actually present, never with the header's claim.
    ///
    /// # Errors
    /// [`DataError::Io`] on read failure, [`DataError::Format`] (path `<stream>`) on malformed data.
    pub fn read_from(mut reader: impl Read, vocab: u32) -> Result<Self> {
        let path = PathBuf::from("<stream>");
        let mut header = vec![0u8; HEADER_BYTES];
        let got = read_up_to(&mut reader, &mut header).map_err(failed("read", &path))?;
        let count = parse_header(&header[..got]).map_err(|e| format_err(&path, e))?;
        let mut payload = Vec::new();
        reader
            .take(count * 2 + 1)
            .read_to_end(&mut payload)
            .map_err(failed("read", &path))?;
        check_payload_len(count, payload.len() as u64).map_err(|e| format_err(&path, e))?;
        let tokens = decode_tokens(&payload, vocab).map_err(|e| format_err(&path, e))?;
        Ok(Self { tokens })
    }

    /// The tokens.
    pub fn tokens(&self) -> &[u16] {
        &self.tokens
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True if the file holds no tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The file's bytes: header then tokens.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + 2 * self.tokens.len());
        // Constructors guarantee the count fits an i32.
        let count = i32::try_from(self.tokens.len()).unwrap_or(i32::MAX);
        out.extend_from_slice(&crate::llmc_header::encode(&[
            TOKEN_MAGIC,
            TOKEN_VERSION,
            count,
        ]));
        for t in &self.tokens {
            out.extend_from_slice(&t.to_le_bytes());
        }
        out
    }

    /// Writes the file atomically and durably: to `<path>.tmp`, fsynced, renamed over
    /// `path`, directory fsynced; a reader never sees a half-written file.
    ///
    /// # Errors
    /// [`DataError::Io`] if writing or renaming fails.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        write_atomic(path.as_ref(), &self.to_bytes())
    }
}

/// Writes `bytes` to `path` durably and atomically (see [`crate::fsio::write_atomic`]).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    Ok(crate::fsio::write_atomic(path, |w| w.write_all(bytes))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_words_are_little_endian_magic_version_count() {
        let bytes = TokenFile::from_tokens(vec![7, 8, 9]).map(|f| f.to_bytes());
        let bytes = bytes.unwrap_or_default();
        assert_eq!(&bytes[0..4], &TOKEN_MAGIC.to_le_bytes());
        assert_eq!(&bytes[4..8], &1i32.to_le_bytes());
        assert_eq!(&bytes[8..12], &3i32.to_le_bytes());
        assert_eq!(bytes.len(), HEADER_BYTES + 6);
        assert_eq!(&bytes[HEADER_BYTES..], &[7, 0, 8, 0, 9, 0]);
    }
}
