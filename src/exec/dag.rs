//! A DAG plan: ops over single-assignment tensor slots, each op bound to a device queue.

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::model::Model;
use crate::reply::GetFormat;
use crate::script::{CallStyle, Script};
use crate::tensor::Tensor;

/// Index of a tensor slot. Every slot is written at most once (by LOAD or by one op).
pub type Slot = usize;

/// An op's input or output slots (a few: on the stack).
pub type Slots = SmallVec<[Slot; 4]>;

/// An op that runs on a device queue. (A DAG's TENSORSET is done at parse time and its TENSORGET at
/// reply time, as in RedisAI 1.2.5+: neither needs a worker.)
pub enum OpKind {
    Model {
        model: Arc<Model>,
        inputs: Slots,
        outputs: Slots,
    },
    Script {
        script: Arc<Script>,
        function: Vec<u8>,
        style: CallStyle,
        inputs: Slots,
        keys: Vec<Vec<u8>>,
        args: Vec<Vec<u8>>,
        outputs: Slots,
    },
}

pub struct Op {
    pub kind: OpKind,
    /// The queue the op runs on (upper-cased device string).
    pub device: std::sync::Arc<str>,
}

/// One word of a command the module writes (a type name, a dimension, a key to persist): on the stack.
pub type Word = SmallVec<[u8; 24]>;

/// What a script op is called with (AI.SCRIPTEXECUTE's and AI.SCRIPTRUN's words, parsed by commands/script.rs).
pub struct ScriptArgs<'a> {
    pub function: &'a [u8],
    pub style: CallStyle,
    pub keys: &'a [&'a [u8]],
    pub args: &'a [&'a [u8]],
}

impl OpKind {
    /// A script call (AI.SCRIPTEXECUTE / AI.SCRIPTRUN) reading `inputs` and writing `outputs`. As in RedisAI,
    /// AI.SCRIPTEXECUTE of a function that is not an entry point (e.g. in a script stored with AI.SCRIPTSET)
    /// makes a best-effort positional call.
    pub fn script(script: Arc<Script>, call: ScriptArgs, inputs: Slots, outputs: Slots) -> OpKind {
        let style = match call.style {
            CallStyle::EntryPoint if !script.spec.is_entry_point(call.function) => {
                CallStyle::Positional { list_from: None }
            }
            s => s,
        };
        OpKind::Script {
            script,
            function: call.function.to_vec(),
            style,
            inputs,
            keys: call.keys.iter().map(|k| k.to_vec()).collect(),
            args: call.args.iter().map(|a| a.to_vec()).collect(),
            outputs,
        }
    }
}

impl Op {
    pub fn inputs(&self) -> &[Slot] {
        match &self.kind {
            OpKind::Model { inputs, .. } | OpKind::Script { inputs, .. } => inputs,
        }
    }
    pub fn outputs(&self) -> &[Slot] {
        match &self.kind {
            OpKind::Model { outputs, .. } | OpKind::Script { outputs, .. } => outputs,
        }
    }
}

/// What one op of the client's DAG contributes to the reply, in the client's order.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplyItem {
    /// A TENSORSET (done at parse time).
    Ok,
    /// A TENSORGET of a slot, read at reply time (`NA` if it was never computed).
    Get { slot: Slot, format: GetFormat },
    /// A queued op: `OK`, its error, or `NA` if it never ran.
    Op(usize),
}

#[derive(Default)]
pub struct Plan {
    pub ops: SmallVec<[Op; 2]>,
    pub replies: SmallVec<[ReplyItem; 4]>,
    pub slots: usize,
    /// Tensors present before any op runs (LOAD, and the inputs of MODELEXECUTE).
    pub loaded: SmallVec<[(Slot, Arc<Tensor>); 4]>,
    /// Keys written at reply time, with the slot holding each one's final value (short names inline: a
    /// MODELEXECUTE's output costs no allocation).
    pub persist: SmallVec<[(Word, Slot); 1]>,
    /// Longest time the run may wait before an op starts (RedisAI's TIMEOUT).
    pub timeout: Option<Duration>,
    /// The client's database and ACL user (what scripts' callbacks act as).
    pub caller: crate::caller::Caller,
}

impl Plan {
    /// Whether an op runs TorchScript (a script, or a TORCH model), whose callbacks need the caller's user.
    pub fn runs_torchscript(&self) -> bool {
        self.ops.iter().any(|op| match &op.kind {
            OpKind::Script { .. } => true,
            OpKind::Model { model, .. } => model.spec.backend == crate::model::BackendKind::Torch,
        })
    }

    pub fn new_slot(&mut self) -> Slot {
        self.slots += 1;
        self.slots - 1
    }

    /// The devices of the plan in order of first use, each with its ops in DAG order.
    pub fn device_ops(&self) -> Vec<(std::sync::Arc<str>, Vec<usize>)> {
        let mut out: Vec<(std::sync::Arc<str>, Vec<usize>)> = Vec::new();
        for (i, op) in self.ops.iter().enumerate() {
            match out.iter_mut().find(|(d, _)| *d == op.device) {
                Some((_, ops)) => ops.push(i),
                None => out.push((op.device.clone(), vec![i])),
            }
        }
        out
    }
}
