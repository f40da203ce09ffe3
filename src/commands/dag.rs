//! AI.DAGEXECUTE[_RO] / AI.DAGRUN[_RO] (docs/commands.md, AI.DAGEXECUTE): parsing, then single-assignment renaming of the
//! DAG-local names into slots. Keys are resolved through a `Resolver`, so this stays free of Redis.

use std::collections::HashMap;
use std::sync::Arc;

use super::model::{parse_modelexecute, parse_modelrun, parse_timeout, Keys};
use super::script::{parse_scriptexecute, parse_scriptrun, ScriptCall};
use super::tensor::{parse_tensor_args, parse_tensorget_format, GetFormat};
use super::{is_keyword, KeyAccess};
use crate::error::{Error, Result};
use crate::exec::dag::{Op, OpKind, Plan, ReplyItem, Slot, Slots};
use crate::model::Model;
use crate::script::Script;
use crate::tensor::{parse_i64, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DagKind {
    Execute,
    ExecuteRo,
    Run,
    RunRo,
}

impl DagKind {
    pub fn name(self) -> &'static str {
        match self {
            DagKind::Execute => "AI.DAGEXECUTE",
            DagKind::ExecuteRo => "AI.DAGEXECUTE_RO",
            DagKind::Run => "AI.DAGRUN",
            DagKind::RunRo => "AI.DAGRUN_RO",
        }
    }
    fn read_only(self) -> bool {
        matches!(self, DagKind::ExecuteRo | DagKind::RunRo)
    }
    fn deprecated(self) -> bool {
        matches!(self, DagKind::Run | DagKind::RunRo)
    }
}

/// Keyspace lookups the parser needs (done at parse time, as RedisAI does).
pub trait Resolver {
    fn tensor(&self, key: &[u8]) -> Result<Arc<Tensor>>;
    fn model(&self, key: &[u8]) -> Result<Arc<Model>>;
    fn script(&self, key: &[u8]) -> Result<Arc<Script>>;
}

fn err(msg: &str) -> Error {
    Error::parse(msg)
}
fn plain(msg: &str) -> Error {
    Error::parse_verbatim(msg)
}

const SEP: &[u8] = b"|>";

/// `<n> <key>...` after LOAD or PERSIST.
fn counted_keys<'a>(argv: &[&'a [u8]], pos: usize, what: &str, mismatch: &str) -> Result<Keys<'a>> {
    // RedisAI wants a count and at least one key after the keyword before it looks at the count.
    if argv.len() < pos + 3 {
        return Err(err(&format!("missing arguments after {what} keyword in DAG command")));
    }
    let count = argv[pos + 1];
    let n = parse_i64(count)
        .filter(|&n| n > 0)
        .ok_or_else(|| err(&format!("invalid or negative value found in number of keys to {what}")))?
        as usize;
    argv.get(pos + 2..pos + 2 + n).map(|keys| keys.iter().copied().collect()).ok_or_else(|| err(mismatch))
}

/// One op of a DAG as parsed, its names borrowed from the command's words.
pub enum Parsed<'a> {
    Set { key: &'a [u8], tensor: Tensor },
    Get { key: &'a [u8], format: GetFormat },
    Model { model: Arc<Model>, inputs: Keys<'a>, outputs: Keys<'a> },
    Script { script: Arc<Script>, call: ScriptCall<'a> },
}

fn parse_op<'a>(op: &[&'a [u8]], kind: DagKind, r: &dyn Resolver) -> Result<Parsed<'a>> {
    let name = op[0];
    if is_keyword(name, "AI.TENSORSET") {
        if op.len() < 4 {
            return Err(plain("wrong number of arguments for 'AI.TENSORSET' command"));
        }
        Ok(Parsed::Set { key: op[1], tensor: parse_tensor_args(&op[2..], &|_| None)? })
    } else if is_keyword(name, "AI.TENSORGET") {
        if !(2..=4).contains(&op.len()) {
            return Err(plain("wrong number of arguments for 'AI.TENSORGET' command"));
        }
        Ok(Parsed::Get { key: op[1], format: parse_tensorget_format(&op[2..])? })
    } else if is_keyword(name, "AI.MODELEXECUTE") {
        if kind.deprecated() {
            return Err(plain("AI.MODELEXECUTE cannot be used in a deprecated AI.DAGRUN command"));
        }
        if op.len() < 8 {
            return Err(Error::WrongArity("AI.MODELEXECUTE"));
        }
        let model = r.model(op[1])?;
        let (ni, no) = model.io_counts();
        let a = parse_modelexecute(op, ni, no)?;
        if a.timeout.is_some() {
            return Err(err("TIMEOUT not allowed within a DAG command"));
        }
        Ok(Parsed::Model { model, inputs: a.inputs, outputs: a.outputs })
    } else if is_keyword(name, "AI.MODELRUN") {
        if !kind.deprecated() {
            return Err(plain("Deprecated AI.MODELRUN cannot be used in AI.DAGEXECUTE command"));
        }
        if op.len() < 6 {
            return Err(Error::WrongArity("AI.MODELRUN"));
        }
        let model = r.model(op[1])?;
        if op.get(2).is_some_and(|a| is_keyword(a, "TIMEOUT")) {
            return Err(err("TIMEOUT not allowed within a DAG command"));
        }
        let (ni, no) = model.io_counts();
        let a = parse_modelrun(op, ni, no)?;
        Ok(Parsed::Model { model, inputs: a.inputs, outputs: a.outputs })
    } else if is_keyword(name, "AI.SCRIPTEXECUTE") {
        if kind.deprecated() {
            return Err(plain("AI.SCRIPTEXECUTE cannot be used in a deprecated AI.DAGRUN command"));
        }
        if kind.read_only() {
            return Err(err("AI.SCRIPTEXECUTE command cannot be specified in a read-only DAG"));
        }
        if op.len() < 3 {
            return Err(Error::WrongArity("AI.SCRIPTEXECUTE"));
        }
        let script = r.script(op[1])?;
        let call = parse_scriptexecute(op, true)?;
        if call.timeout.is_some() {
            return Err(err("TIMEOUT not allowed within a DAG command"));
        }
        Ok(Parsed::Script { script, call })
    } else if is_keyword(name, "AI.SCRIPTRUN") {
        if !kind.deprecated() {
            return Err(plain("Deprecated AI.SCRIPTRUN cannot be used in AI.DAGEXECUTE command"));
        }
        if op.len() < 3 {
            return Err(Error::WrongArity("AI.SCRIPTRUN"));
        }
        let script = r.script(op[1])?;
        let call = parse_scriptrun(op)?;
        if call.timeout.is_some() {
            return Err(err("TIMEOUT not allowed within a DAG command"));
        }
        Ok(Parsed::Script { script, call })
    } else {
        Err(plain("Unsupported command within DAG"))
    }
}

/// Parses a DAG command and plans it: LOADed tensors and TENSORSETs fill slots at once, every name an op
/// writes gets a fresh slot (so reusing a name never clobbers a value an earlier op still reads).
/// Most ops one DAG may have: parsing and planning run on Redis's main thread (100,000 ops take ~0.1 s).
pub const MAX_DAG_OPS: usize = 100_000;

/// Bytes the zero-filled TENSORSET ops of a DAG argv would allocate together (see `zero_filled_bytes`).
pub fn dag_zero_filled_bytes(argv: &[&[u8]]) -> usize {
    argv.split(|a| *a == SEP)
        .skip(1)
        .filter(|op| op.first().is_some_and(|w| is_keyword(w, "AI.TENSORSET")) && op.len() > 2)
        .filter_map(|op| super::tensor::zero_filled_bytes(&op[2..]))
        .fold(0usize, usize::saturating_add)
}

pub fn parse_dag(argv: &[&[u8]], kind: DagKind, r: &dyn Resolver) -> Result<Plan> {
    if kind.deprecated() && argv.len() < 4 {
        return Err(Error::WrongArity(kind.name()));
    }
    if !kind.deprecated() && argv.len() < 6 {
        return Err(err(&format!("missing arguments for '{}' command", kind.name())));
    }
    let mut planner = Planner::default();
    let mut persist = Keys::new();
    let (mut seen_load, mut seen_persist, mut seen_routing, mut seen_timeout) = (false, false, false, false);
    let mut pos = 1;
    while pos < argv.len() && argv[pos] != SEP {
        let arg = argv[pos];
        if is_keyword(arg, "LOAD") && !seen_load {
            seen_load = true;
            let keys = counted_keys(
                argv,
                pos,
                "LOAD",
                "number of keys to LOAD into DAG does not match the number of given arguments",
            )?;
            for key in &keys {
                planner.load(key, r.tensor(key)?);
            }
            pos += 2 + keys.len();
        } else if is_keyword(arg, "PERSIST") && !seen_persist {
            if kind.read_only() {
                return Err(err("PERSIST cannot be specified in a read-only DAG"));
            }
            seen_persist = true;
            persist = counted_keys(
                argv,
                pos,
                "PERSIST",
                "number of keys to PERSIST after DAG execution does not match the number of given arguments",
            )?;
            if (1..persist.len()).any(|i| persist[..i].contains(&persist[i])) {
                return Err(err("PERSIST keys must be unique"));
            }
            pos += 2 + persist.len();
        } else if is_keyword(arg, "ROUTING") && !seen_routing && !kind.deprecated() {
            seen_routing = true;
            argv.get(pos + 1).ok_or_else(|| err("Missing ROUTING value"))?;
            pos += 2;
        } else if is_keyword(arg, "TIMEOUT") && !seen_timeout {
            seen_timeout = true;
            planner.plan.timeout = Some(parse_timeout(argv.get(pos + 1))?);
            pos += 2;
        } else {
            return Err(err(&format!("Invalid DAG command. Unexpected argument:  {}", String::from_utf8_lossy(arg))));
        }
    }
    if !(kind.deprecated() || seen_load || seen_persist || seen_routing) {
        return Err(err(
            "AI.DAGEXECUTE and AI.DAGEXECUTE_RO commands must contain at least one out of ROUTING, LOAD, PERSIST keywords",
        ));
    }
    if pos >= argv.len() {
        return Err(err("DAG is empty"));
    }
    // argv[pos] is the first separator; every op follows one.
    if argv[pos..].iter().filter(|a| **a == SEP).count() > MAX_DAG_OPS {
        return Err(err(&format!("DAG has too many operations (the limit is {MAX_DAG_OPS})")));
    }
    let mut parsed: smallvec::SmallVec<[Parsed; 2]> = smallvec::SmallVec::new();
    for op in argv[pos + 1..].split(|a| *a == SEP) {
        if op.is_empty() {
            return Err(err("Invalid DAG command. Unexpected argument:  |>"));
        }
        parsed.push(parse_op(op, kind, r)?);
    }

    for p in parsed {
        planner.add(p)?;
    }
    for key in persist {
        let slot = planner.names.get(key).ok_or_else(|| err("PERSIST key cannot be found in DAG"))?;
        planner.plan.persist.push((crate::commands::tensor::Word::from_slice(key), slot));
    }
    Ok(planner.plan)
}

/// Turns the words of a DAG's ops (`|> op ... |> op ...`, as the low-level API's `DAGAddOpsFromString` takes
/// them) into parsed ops: all of them or an error.
pub fn parse_dag_ops<'a>(words: &[&'a [u8]], r: &dyn Resolver) -> Result<Vec<Parsed<'a>>> {
    if words.first() != Some(&SEP) {
        return Err(plain("DAG op should start with: '|>' "));
    }
    if words.iter().filter(|a| **a == SEP).count() > MAX_DAG_OPS {
        return Err(err(&format!("DAG has too many operations (the limit is {MAX_DAG_OPS})")));
    }
    words[1..]
        .split(|a| *a == SEP)
        .map(|op| {
            if op.is_empty() {
                Err(err("Invalid DAG command. Unexpected argument:  |>"))
            } else {
                parse_op(op, DagKind::Execute, r)
            }
        })
        .collect()
}

/// A plan being built from named ops, in DAG order: each input is the current value of its name, each output
/// a fresh slot that the name then points to (single assignment, so reusing a name never clobbers a value an
/// earlier op still reads). AI.DAGEXECUTE and the low-level API's DAGs both plan through it.
#[derive(Default)]
pub struct Planner<'a> {
    pub plan: Plan,
    names: Names<'a>,
}

impl<'a> Planner<'a> {
    /// A tensor present before the run (LOAD): no reply of its own.
    pub fn load(&mut self, name: &'a [u8], tensor: Arc<Tensor>) {
        let s = self.plan.new_slot();
        self.plan.loaded.push((s, tensor));
        self.names.insert(name, s);
    }

    /// A TENSORSET: the tensor under `name`, answered `OK`.
    pub fn set(&mut self, name: &'a [u8], tensor: Arc<Tensor>) {
        self.load(name, tensor);
        self.plan.replies.push(ReplyItem::Ok);
    }

    /// A model op over named tensors.
    pub fn model(&mut self, model: Arc<Model>, inputs: &[&'a [u8]], outputs: &[&'a [u8]]) -> Result<()> {
        let (inputs, outputs) = bind(&mut self.plan, &mut self.names, inputs, outputs)?;
        let device = model.spec.device.queue_key();
        self.plan.replies.push(ReplyItem::Op(self.plan.ops.len()));
        self.plan.ops.push(Op { kind: OpKind::Model { model, inputs, outputs }, device });
        Ok(())
    }

    /// A script op over named tensors.
    pub fn script(
        &mut self,
        script: Arc<Script>,
        call: crate::exec::dag::ScriptArgs,
        inputs: &[&'a [u8]],
        outputs: &[&'a [u8]],
    ) -> Result<()> {
        let (inputs, outputs) = bind(&mut self.plan, &mut self.names, inputs, outputs)?;
        let device = script.queue_key();
        self.plan.replies.push(ReplyItem::Op(self.plan.ops.len()));
        self.plan.ops.push(Op { kind: OpKind::script(script, call, inputs, outputs), device });
        Ok(())
    }

    /// One parsed op, in DAG order.
    pub fn add(&mut self, p: Parsed<'a>) -> Result<()> {
        match p {
            Parsed::Set { key, tensor } => self.set(key, Arc::new(tensor)),
            Parsed::Get { key, format } => {
                let slot = self.names.get(key).ok_or_else(|| err("INPUT key cannot be found in DAG"))?;
                self.plan.replies.push(ReplyItem::Get { slot, format });
            }
            Parsed::Model { model, inputs, outputs } => self.model(model, &inputs, &outputs)?,
            Parsed::Script { script, call } => self.script(script, call.op_args(), &call.inputs, &call.outputs)?,
        }
        Ok(())
    }
}

/// DAG-local names and the slot each one holds now: a short list for the usual few names, a hash map once a
/// DAG has many (up to `MAX_DAG_OPS` ops must stay linear).
enum Names<'a> {
    Few(smallvec::SmallVec<[(&'a [u8], Slot); 8]>),
    Many(HashMap<&'a [u8], Slot>),
}

impl Default for Names<'_> {
    fn default() -> Self {
        Names::Few(smallvec::SmallVec::new())
    }
}

impl<'a> Names<'a> {
    const FEW: usize = 16;

    fn get(&self, name: &[u8]) -> Option<Slot> {
        match self {
            Names::Few(v) => v.iter().find(|(n, _)| *n == name).map(|&(_, s)| s),
            Names::Many(m) => m.get(name).copied(),
        }
    }

    fn insert(&mut self, name: &'a [u8], slot: Slot) {
        match self {
            Names::Few(v) => {
                if let Some(entry) = v.iter_mut().find(|(n, _)| *n == name) {
                    entry.1 = slot;
                } else if v.len() < Self::FEW {
                    v.push((name, slot));
                } else {
                    let mut m: HashMap<&[u8], Slot> = v.drain(..).collect();
                    m.insert(name, slot);
                    *self = Names::Many(m);
                }
            }
            Names::Many(m) => {
                m.insert(name, slot);
            }
        }
    }
}

/// An op's slots: each input is the current value of its name; each output gets a fresh slot, and the
/// name now points there (single assignment).
fn bind<'a>(
    plan: &mut Plan,
    names: &mut Names<'a>,
    inputs: &[&'a [u8]],
    outputs: &[&'a [u8]],
) -> Result<(Slots, Slots)> {
    let ins = inputs
        .iter()
        .map(|k| names.get(k).ok_or_else(|| err("INPUT key cannot be found in DAG")))
        .collect::<Result<Slots>>()?;
    let outs = outputs
        .iter()
        .map(|k| {
            let s = plan.new_slot();
            names.insert(k, s);
            s
        })
        .collect();
    Ok((ins, outs))
}

/// Keys of a DAG command (cluster routing, ACL): LOAD keys are read, PERSIST keys written, ROUTING only routes,
/// and the model/script of each AI.MODELEXECUTE / AI.SCRIPTEXECUTE op is read (DAG-local names are not keys;
/// the KEYS of a script op are checked when the script uses them, by `redis.execute` under the caller's ACL).
pub fn dag_key_positions(argv: &[&[u8]]) -> Vec<(usize, KeyAccess)> {
    let mut keys = Vec::new();
    let mut pos = 1;
    while pos < argv.len() && argv[pos] != SEP {
        let a = argv[pos];
        if is_keyword(a, "LOAD") || is_keyword(a, "PERSIST") {
            let access = if is_keyword(a, "LOAD") { KeyAccess::Read } else { KeyAccess::Write };
            let n = argv.get(pos + 1).and_then(|c| parse_i64(c)).filter(|&n| n > 0).unwrap_or(0) as usize;
            let end = (pos + 2 + n).min(argv.len());
            keys.extend((pos + 2..end).map(|k| (k, access)));
            pos = end;
        } else if is_keyword(a, "ROUTING") {
            if pos + 1 < argv.len() {
                keys.push((pos + 1, KeyAccess::Route));
            }
            pos += 2;
        } else if is_keyword(a, "TIMEOUT") {
            pos += 2;
        } else {
            pos += 1;
        }
    }
    for i in pos..argv.len() {
        if argv[i] == SEP
            && argv.get(i + 1).is_some_and(|a| is_keyword(a, "AI.MODELEXECUTE") || is_keyword(a, "AI.SCRIPTEXECUTE"))
            && i + 2 < argv.len()
        {
            keys.push((i + 2, KeyAccess::Read));
        }
    }
    keys
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::backends::LoadedModel;
    use crate::device::Device;
    use crate::model::{BackendKind, BatchOpts, ModelSpec};

    struct Identity;
    impl LoadedModel for Identity {
        fn inputs(&self) -> &[String] {
            static N: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
            N.get_or_init(|| vec!["x".into()])
        }
        fn outputs(&self) -> &[String] {
            self.inputs()
        }
        fn run(&self, req: &crate::backends::RunRequest) -> Result<crate::backends::Outputs> {
            Ok(req.inputs.iter().map(|t| (*t).clone()).collect())
        }
    }

    /// A keyspace of a FLOAT tensor `t`, models `m` (CPU) and `m1` (CPU:1) of one input and one output.
    pub(crate) struct Fake;
    impl Resolver for Fake {
        fn tensor(&self, key: &[u8]) -> Result<Arc<Tensor>> {
            match key {
                b"t" => Ok(Arc::new(Tensor::zeros(crate::tensor::DataType::Float, vec![1]).unwrap())),
                _ => Err(Error::TensorKeyEmpty),
            }
        }
        fn model(&self, key: &[u8]) -> Result<Arc<Model>> {
            let dev = if key == b"m1" { "CPU:1" } else { "CPU" };
            let spec = ModelSpec {
                backend: BackendKind::Onnx,
                device: Device::parse(dev.as_bytes()).unwrap(),
                tag: vec![],
                batch: BatchOpts::default(),
                inputs: vec!["x".into()],
                outputs: vec!["y".into()],
                blob: Vec::new().into(),
            };
            Ok(Arc::new(Model::with_handle(key, spec, Ok(Box::new(Identity)))))
        }
        fn script(&self, _key: &[u8]) -> Result<Arc<Script>> {
            Err(Error::ScriptKeyEmpty)
        }
    }

    fn parse(kind: DagKind, s: &str) -> Result<Plan> {
        let words: Vec<&[u8]> = s.split(' ').map(str::as_bytes).collect();
        parse_dag(&words, kind, &Fake)
    }
    fn e(kind: DagKind, s: &str) -> String {
        parse(kind, s).err().map(|e| e.reply_text()).unwrap_or_default()
    }
    use DagKind::*;

    #[test]
    fn header_errors_in_order() {
        assert_eq!(e(Execute, "AI.DAGEXECUTE LOAD 1 t |>"), "ERR missing arguments for 'AI.DAGEXECUTE' command");
        assert_eq!(e(Run, "AI.DAGRUN |>"), "ERR wrong number of arguments for 'AI.DAGRUN' command");
        assert_eq!(
            e(Execute, "AI.DAGEXECUTE LOAD x t |> AI.TENSORGET t"),
            "ERR invalid or negative value found in number of keys to LOAD"
        );
        assert_eq!(
            e(Execute, "AI.DAGEXECUTE LOAD 5 t |> AI.TENSORGET t"),
            "ERR number of keys to LOAD into DAG does not match the number of given arguments"
        );
        assert_eq!(
            e(Execute, "AI.DAGEXECUTE LOAD 1 nope |> AI.TENSORGET t"),
            "ERR tensor key is empty or in a different shard"
        );
        assert_eq!(
            e(ExecuteRo, "AI.DAGEXECUTE_RO PERSIST 1 a |> AI.TENSORGET a"),
            "ERR PERSIST cannot be specified in a read-only DAG"
        );
        assert_eq!(e(Execute, "AI.DAGEXECUTE PERSIST 2 a a |> AI.TENSORGET a"), "ERR PERSIST keys must be unique");
        assert_eq!(
            e(Execute, "AI.DAGEXECUTE ROUTING t FOO |> AI.TENSORGET t"),
            "ERR Invalid DAG command. Unexpected argument:  FOO"
        );
        assert_eq!(
            e(Execute, "AI.DAGEXECUTE TIMEOUT 5 |> AI.TENSORGET t x"),
            "ERR AI.DAGEXECUTE and AI.DAGEXECUTE_RO commands must contain at least one out of ROUTING, LOAD, PERSIST keywords"
        );
        assert_eq!(e(Execute, "AI.DAGEXECUTE ROUTING t TIMEOUT 0 |> AI.TENSORGET t"), "ERR Invalid value for TIMEOUT");
        assert_eq!(e(Execute, "AI.DAGEXECUTE ROUTING t TIMEOUT 5 LOAD 1 t"), "ERR DAG is empty");
        assert_eq!(
            e(Execute, "AI.DAGEXECUTE LOAD 1 t |> AI.TENSORGET t |>"),
            "ERR Invalid DAG command. Unexpected argument:  |>"
        );
    }

    #[test]
    fn op_errors() {
        assert_eq!(e(Execute, "AI.DAGEXECUTE LOAD 1 t |> AI.FOO t"), "Unsupported command within DAG");
        assert_eq!(
            e(Execute, "AI.DAGEXECUTE LOAD 1 t |> AI.TENSORGET"),
            "wrong number of arguments for 'AI.TENSORGET' command"
        );
        assert_eq!(
            e(Execute, "AI.DAGEXECUTE LOAD 1 t |> AI.MODELRUN m INPUTS t OUTPUTS y"),
            "Deprecated AI.MODELRUN cannot be used in AI.DAGEXECUTE command"
        );
        assert_eq!(
            e(Run, "AI.DAGRUN LOAD 1 t |> AI.MODELEXECUTE m INPUTS 1 t OUTPUTS 1 y"),
            "AI.MODELEXECUTE cannot be used in a deprecated AI.DAGRUN command"
        );
        assert_eq!(
            e(ExecuteRo, "AI.DAGEXECUTE_RO LOAD 1 t |> AI.SCRIPTEXECUTE s f INPUTS 1 t"),
            "ERR AI.SCRIPTEXECUTE command cannot be specified in a read-only DAG"
        );
        assert_eq!(
            e(Execute, "AI.DAGEXECUTE LOAD 1 t |> AI.MODELEXECUTE m INPUTS 1 t OUTPUTS 1 y TIMEOUT 5"),
            "ERR TIMEOUT not allowed within a DAG command"
        );
        assert_eq!(
            e(Execute, "AI.DAGEXECUTE LOAD 1 t |> AI.MODELEXECUTE m INPUTS 1 u OUTPUTS 1 y"),
            "ERR INPUT key cannot be found in DAG"
        );
        assert_eq!(
            e(Execute, "AI.DAGEXECUTE PERSIST 1 z |> AI.TENSORSET a FLOAT 1"),
            "ERR PERSIST key cannot be found in DAG"
        );
    }

    #[test]
    fn names_keep_their_latest_slot_in_a_list_and_in_a_map() {
        let keys: Vec<Vec<u8>> = (0..40).map(|i| format!("k{i}").into_bytes()).collect();
        let mut names = Names::default();
        for (i, k) in keys.iter().enumerate() {
            names.insert(k, i);
            if i == 5 {
                names.insert(&keys[2], 100); // a name written again points at its new slot
                assert!(matches!(names, Names::Few(_)));
            }
        }
        assert!(matches!(names, Names::Many(_)), "past FEW names it is a map");
        assert_eq!(names.get(b"k2"), Some(100));
        assert_eq!(names.get(b"k39"), Some(39));
        assert_eq!(names.get(b"k0"), Some(0));
        assert_eq!(names.get(b"nope"), None);
        names.insert(&keys[39], 7);
        assert_eq!(names.get(b"k39"), Some(7));
    }

    #[test]
    fn names_are_single_assignment() {
        let p = parse(
            Execute,
            "AI.DAGEXECUTE PERSIST 1 a |> AI.TENSORSET a FLOAT 1 VALUES 1 |> AI.TENSORGET a VALUES |> AI.TENSORSET a FLOAT 1 VALUES 2 \
             |> AI.MODELEXECUTE m1 INPUTS 1 a OUTPUTS 1 a |> AI.TENSORGET a VALUES",
        )
        .unwrap();
        assert_eq!(p.slots, 3);
        assert_eq!(
            p.replies[1],
            ReplyItem::Get { slot: 0, format: GetFormat { meta: false, blob: false, values: true } }
        );
        assert_eq!(p.ops[0].inputs(), &[1]);
        assert_eq!(p.ops[0].outputs(), &[2]);
        assert_eq!(&*p.ops[0].device, "CPU:1");
        assert_eq!(p.persist[..], [(crate::commands::tensor::Word::from_slice(b"a"), 2)]);
    }

    #[test]
    fn key_positions() {
        let words: Vec<&[u8]> =
            "AI.DAGEXECUTE LOAD 2 a b PERSIST 1 c ROUTING r TIMEOUT 5 |> AI.MODELEXECUTE m INPUTS 1 a OUTPUTS 1 c |> AI.TENSORGET c"
                .split(' ')
                .map(str::as_bytes)
                .collect();
        use KeyAccess::{Read as R, Route, Write as W};
        assert_eq!(dag_key_positions(&words), vec![(3, R), (4, R), (7, W), (9, Route), (14, R)]);
    }
}
