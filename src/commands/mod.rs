//! Pure parsers: argv (the command name first, as Redis passes it) to typed requests.

pub mod config;
pub mod dag;
pub mod dag_builder;
pub mod model;
pub mod script;
pub mod tensor;

#[cfg(test)]
pub(crate) mod fuzz;

/// How a command uses one of its keys: the key-spec flags Redis checks ACL selectors against (`%R~in:*`
/// allows reading `in:*` keys only, `%W~out:*` writing `out:*` keys only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyAccess {
    /// The value is read and returned or used (a model, an input tensor, LOAD).
    Read,
    /// The value is replaced without being read (an output tensor, PERSIST, a stored model).
    Write,
    /// Read and written (a script's KEYS, which its `redis.execute` calls may use either way).
    ReadWrite,
    /// Deleted (AI.MODELDEL, AI.SCRIPTDEL).
    Delete,
    /// Named only to choose the shard (a DAG's ROUTING key): neither read nor written.
    Route,
}

/// The positions of a command's keys in argv and how each is used (the getkeys callback's answer).
pub type KeyPositions = fn(&[&[u8]]) -> Vec<(usize, KeyAccess)>;

/// Commands whose only key is argv[1].
pub fn first_key_read(argv: &[&[u8]]) -> Vec<(usize, KeyAccess)> {
    first_key(argv, KeyAccess::Read)
}
pub fn first_key_write(argv: &[&[u8]]) -> Vec<(usize, KeyAccess)> {
    first_key(argv, KeyAccess::Write)
}
pub fn first_key_delete(argv: &[&[u8]]) -> Vec<(usize, KeyAccess)> {
    first_key(argv, KeyAccess::Delete)
}
fn first_key(argv: &[&[u8]], access: KeyAccess) -> Vec<(usize, KeyAccess)> {
    if argv.len() > 1 {
        vec![(1, access)]
    } else {
        Vec::new()
    }
}

/// Case-insensitive keyword match, like RedisAI's `strcasecmp`.
#[inline]
pub fn is_keyword(arg: &[u8], keyword: &str) -> bool {
    arg.eq_ignore_ascii_case(keyword.as_bytes())
}

/// An optional `TAG <tag>` at `*pos` (advancing past it); `missing` is the error when the value is absent.
pub fn optional_tag(argv: &[&[u8]], pos: &mut usize, missing: &str) -> crate::error::Result<Vec<u8>> {
    if !argv.get(*pos).is_some_and(|a| is_keyword(a, "TAG")) {
        return Ok(Vec::new());
    }
    let tag = argv.get(*pos + 1).ok_or_else(|| crate::error::Error::parse(missing))?.to_vec();
    *pos += 2;
    Ok(tag)
}

/// Splits a test command line into argv.
#[cfg(test)]
pub fn words(s: &str) -> Vec<&[u8]> {
    s.split(' ').map(str::as_bytes).collect()
}
