//! Pure parsers: argv (the command name first, as Redis passes it) to typed requests.

pub mod config;
pub mod dag;
pub mod model;
pub mod script;
pub mod tensor;

/// Case-insensitive keyword match, like RedisAI's `strcasecmp`.
pub fn is_keyword(arg: &[u8], keyword: &str) -> bool {
    arg.eq_ignore_ascii_case(keyword.as_bytes())
}
