//! What a script is declared with and how a function of it is called: a leaf, so that the TORCH backend takes
//! them without depending on scripts.

/// How a script function receives its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallStyle {
    /// `def f(tensors: List[Tensor], keys: List[str], args: List[str])` (AI.SCRIPTEXECUTE).
    EntryPoint,
    /// Tensor parameters, the ones from `list_from` on (`$`) as a List[Tensor] (AI.SCRIPTRUN).
    Positional { list_from: Option<usize> },
}

/// Everything a script is declared with; what the RDB, AOF and SCRIPTGET carry.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptSpec {
    /// As given (RedisAI does not validate it at the command level; the backend does).
    pub device_name: String,
    pub tag: Vec<u8>,
    pub source: String,
    /// Empty for scripts stored with the deprecated AI.SCRIPTSET.
    pub entry_points: Vec<String>,
}

impl ScriptSpec {
    /// Whether `function` was declared an entry point (AI.SCRIPTSTORE ... ENTRY_POINTS).
    pub fn is_entry_point(&self, function: &[u8]) -> bool {
        self.entry_points.iter().any(|e| e.as_bytes() == function)
    }
}
