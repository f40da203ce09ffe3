//! Pure parsers: argv (the command name first, as Redis passes it) to typed requests.

pub mod config;
pub mod dag;
pub mod model;
pub mod script;
pub mod tensor;

#[cfg(test)]
mod fuzz;

/// Case-insensitive keyword match, like RedisAI's `strcasecmp`.
pub fn is_keyword(arg: &[u8], keyword: &str) -> bool {
    arg.eq_ignore_ascii_case(keyword.as_bytes())
}

/// An optional `TAG <tag>` at `*pos` (advancing past it); `missing` is the error when the value is absent.
pub fn optional_tag(argv: &[&[u8]], pos: &mut usize, missing: &str) -> crate::error::Result<Vec<u8>> {
    if !argv.get(*pos).is_some_and(|a| is_keyword(a, "TAG")) {
        return Ok(Vec::new());
    }
    let tag = argv.get(*pos + 1).ok_or_else(|| crate::error::Error::Generic(missing.to_string()))?.to_vec();
    *pos += 2;
    Ok(tag)
}

/// Splits a test command line into argv.
#[cfg(test)]
pub fn words(s: &str) -> Vec<&[u8]> {
    s.split(' ').map(str::as_bytes).collect()
}
