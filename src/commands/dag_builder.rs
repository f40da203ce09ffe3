//! A DAG put together op by op (the low-level API's `RAI_DAGRunCtx`, docs/commands.md "Low-level API"): the
//! steps are kept with owned names, and planned through the same `Planner` as AI.DAGEXECUTE when the DAG runs.

use std::sync::Arc;

use super::dag::{parse_dag_ops, Parsed, Planner, Resolver};
use crate::error::{Error, Result};
use crate::exec::dag::{Plan, ReplyItem, ScriptArgs};
use crate::model::{Model, ANY_COUNT};
use crate::reply::GetFormat;
use crate::script::{CallStyle, Script};
use crate::tensor::Tensor;

/// A model or script call over DAG-local names (`RAI_DAGRunOp`, and what a run context becomes).
pub struct CallOp {
    pub target: Target,
    pub inputs: Vec<Vec<u8>>,
    pub outputs: Vec<Vec<u8>>,
}

pub enum Target {
    Model(Arc<Model>),
    Script { script: Arc<Script>, function: Vec<u8>, style: CallStyle, keys: Vec<Vec<u8>>, args: Vec<Vec<u8>> },
}

impl CallOp {
    pub fn model(model: Arc<Model>) -> CallOp {
        CallOp { target: Target::Model(model), inputs: Vec::new(), outputs: Vec::new() }
    }

    /// A call of `function`: an entry point gets its tensors as one list (AI.SCRIPTEXECUTE); any other function
    /// gets them as positional arguments, the ones from `list_from` on as a List[Tensor] (AI.SCRIPTRUN).
    pub fn script(script: Arc<Script>, function: &[u8], list_from: Option<usize>) -> CallOp {
        let style = if script.spec.is_entry_point(function) {
            CallStyle::EntryPoint
        } else {
            CallStyle::Positional { list_from }
        };
        let target = Target::Script { script, function: function.to_vec(), style, keys: Vec::new(), args: Vec::new() };
        CallOp { target, inputs: Vec::new(), outputs: Vec::new() }
    }

    /// Makes the inputs from `list_from` on one List[Tensor] argument (a positional script call).
    pub fn set_list_from(&mut self, from: Option<usize>) {
        if let Target::Script { style: CallStyle::Positional { list_from }, .. } = &mut self.target {
            *list_from = from;
        }
    }

    pub fn is_model(&self) -> bool {
        matches!(self.target, Target::Model(_))
    }

    /// The AI.INFO entry of the model or script called.
    pub fn stats(&self) -> &crate::stats::Stats {
        match &self.target {
            Target::Model(model) => &model.stats,
            Target::Script { script, .. } => &script.stats,
        }
    }

    /// RedisAI's check when a model op joins a DAG: as many inputs and outputs as the model declares.
    pub fn check_counts(&self) -> Result<()> {
        let Target::Model(model) = &self.target else { return Ok(()) };
        let (ni, no) = model.io_counts();
        let mismatch = |what: &str| {
            Error::parse_verbatim(format!("Number of keys given as {what} does not match model definition"))
        };
        if ni != ANY_COUNT && self.inputs.len() != ni {
            return Err(mismatch("INPUTS"));
        }
        if no != ANY_COUNT && self.outputs.len() != no {
            return Err(mismatch("OUTPUTS"));
        }
        Ok(())
    }

    fn plan_into<'a>(&'a self, planner: &mut Planner<'a>) -> Result<()> {
        let (ins, outs) = (borrowed(&self.inputs), borrowed(&self.outputs));
        match &self.target {
            Target::Model(model) => planner.model(model.clone(), &ins, &outs),
            Target::Script { script, function, style, keys, args } => {
                let (keys, args) = (borrowed(keys), borrowed(args));
                let call = ScriptArgs { function, style: *style, keys: &keys, args: &args };
                planner.script(script.clone(), call, &ins, &outs)
            }
        }
    }
}

/// Names kept by the builder (the caller's are borrowed for one call only).
fn owned(names: &[&[u8]]) -> Vec<Vec<u8>> {
    names.iter().map(|n| n.to_vec()).collect()
}

/// The builder's names as the planner takes them.
fn borrowed(names: &[Vec<u8>]) -> Vec<&[u8]> {
    names.iter().map(Vec::as_slice).collect()
}

enum Step {
    /// Present before the run; not an op.
    Load(Vec<u8>, Arc<Tensor>),
    Set(Vec<u8>, Arc<Tensor>),
    Get(Vec<u8>),
    Call(CallOp),
}

impl From<Parsed<'_>> for Step {
    /// A parsed op with its names owned.
    fn from(p: Parsed<'_>) -> Step {
        match p {
            Parsed::Set { key, tensor } => Step::Set(key.to_vec(), Arc::new(tensor)),
            Parsed::Get { key, .. } => Step::Get(key.to_vec()),
            Parsed::Model { model, inputs, outputs } => {
                Step::Call(CallOp { target: Target::Model(model), inputs: owned(&inputs), outputs: owned(&outputs) })
            }
            Parsed::Script { script, call } => Step::Call(CallOp {
                inputs: owned(&call.inputs),
                outputs: owned(&call.outputs),
                target: Target::Script {
                    script,
                    function: call.function.to_vec(),
                    style: call.style,
                    keys: owned(&call.keys),
                    args: owned(&call.args),
                },
            }),
        }
    }
}

#[derive(Default)]
pub struct DagBuilder {
    steps: Vec<Step>,
}

impl DagBuilder {
    /// A tensor under `name` before the run; a name loads once.
    pub fn load(&mut self, name: &[u8], tensor: Arc<Tensor>) -> Result<()> {
        if self.steps.iter().any(|s| matches!(s, Step::Load(n, _) if n == name)) {
            return Err(Error::parse(format!("a tensor named {} is already loaded", String::from_utf8_lossy(name))));
        }
        self.steps.push(Step::Load(name.to_vec(), tensor));
        Ok(())
    }

    pub fn set(&mut self, name: &[u8], tensor: Arc<Tensor>) {
        self.steps.push(Step::Set(name.to_vec(), tensor));
    }

    pub fn get(&mut self, name: &[u8]) {
        self.steps.push(Step::Get(name.to_vec()));
    }

    /// A model or script op; a model op must match the model's input and output counts.
    pub fn call(&mut self, op: CallOp) -> Result<()> {
        op.check_counts()?;
        self.steps.push(Step::Call(op));
        Ok(())
    }

    /// The ops of `|> AI.MODELEXECUTE … |> AI.TENSORGET …` (as in AI.DAGEXECUTE), all of them or none.
    pub fn add_words(&mut self, words: &[&[u8]], r: &dyn Resolver) -> Result<()> {
        let steps: Vec<Step> = parse_dag_ops(words, r)?.into_iter().map(Step::from).collect();
        for step in &steps {
            if let Step::Call(op) = step {
                op.check_counts()?;
            }
        }
        self.steps.extend(steps);
        Ok(())
    }

    /// Ops so far (LOADs are not ops).
    pub fn num_ops(&self) -> usize {
        self.steps.iter().filter(|s| !matches!(s, Step::Load(..))).count()
    }

    /// The plan to run; its TENSORGETs are the run's outputs, in order.
    pub fn plan(&self) -> Result<Plan> {
        if self.num_ops() == 0 {
            return Err(Error::parse("DAG is empty"));
        }
        let mut planner = Planner::default();
        for step in &self.steps {
            match step {
                Step::Load(name, t) => planner.load(name, t.clone()),
                Step::Set(name, t) => planner.set(name, t.clone()),
                Step::Get(name) => planner.add(Parsed::Get { key: name, format: GetFormat::default() })?,
                Step::Call(op) => op.plan_into(&mut planner)?,
            }
        }
        Ok(planner.plan)
    }
}

/// The slots a plan's TENSORGETs read, in order (the outputs of a low-level API DAG run).
pub fn get_slots(plan: &Plan) -> Vec<usize> {
    plan.replies.iter().filter_map(|r| if let ReplyItem::Get { slot, .. } = r { Some(*slot) } else { None }).collect()
}

/// A plan of one call whose inputs are `tensors` in order (a run context of the low-level API).
pub fn call_plan(op: &CallOp, tensors: &[Arc<Tensor>]) -> Result<Plan> {
    op.check_counts()?;
    let mut planner = Planner::default();
    for (name, t) in op.inputs.iter().zip(tensors) {
        planner.load(name, t.clone());
    }
    op.plan_into(&mut planner)?;
    Ok(planner.plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::dag::tests::Fake;
    use crate::exec::dag::OpKind;

    fn t() -> Arc<Tensor> {
        Fake.tensor(b"t").unwrap()
    }

    fn model_op(inputs: &[&str], outputs: &[&str]) -> CallOp {
        let mut op = CallOp::model(Fake.model(b"m").unwrap());
        op.inputs = inputs.iter().map(|s| s.as_bytes().to_vec()).collect();
        op.outputs = outputs.iter().map(|s| s.as_bytes().to_vec()).collect();
        op
    }

    #[test]
    fn counts_are_checked_against_the_model() {
        let text = |op: CallOp| op.check_counts().unwrap_err().reply_text();
        assert_eq!(text(model_op(&[], &["y"])), "Number of keys given as INPUTS does not match model definition");
        assert_eq!(text(model_op(&["x"], &[])), "Number of keys given as OUTPUTS does not match model definition");
        assert!(model_op(&["x"], &["y"]).check_counts().is_ok());
        let mut dag = DagBuilder::default();
        assert!(dag.call(model_op(&["x", "x"], &["y"])).is_err());
        assert_eq!(dag.num_ops(), 0);
    }

    #[test]
    fn loads_are_not_ops_and_load_once() {
        let mut dag = DagBuilder::default();
        dag.load(b"a", t()).unwrap();
        assert!(dag.load(b"a", t()).is_err());
        assert_eq!(dag.num_ops(), 0);
        assert_eq!(dag.plan().err().map(|e| e.reply_text()).as_deref(), Some("ERR DAG is empty"));
        dag.get(b"missing");
        assert_eq!(dag.plan().err().map(|e| e.reply_text()).as_deref(), Some("ERR INPUT key cannot be found in DAG"));
    }

    #[test]
    fn chained_ops_plan_into_fresh_slots_and_gets_are_outputs() {
        let mut dag = DagBuilder::default();
        dag.load(b"a", t()).unwrap();
        dag.call(model_op(&["a"], &["b"])).unwrap();
        dag.call(model_op(&["b"], &["b"])).unwrap();
        dag.get(b"b");
        dag.get(b"a");
        let plan = dag.plan().unwrap();
        assert_eq!(plan.ops.len(), 2);
        // The second op reads the first's output and writes a slot of its own; the gets read the last values.
        assert_eq!(plan.ops[1].inputs(), plan.ops[0].outputs());
        assert_ne!(plan.ops[1].outputs(), plan.ops[0].outputs());
        assert_eq!(get_slots(&plan), vec![plan.ops[1].outputs()[0], plan.loaded[0].0]);
    }

    #[test]
    fn ops_from_words_are_added_whole_or_not_at_all() {
        let words = |s: &'static str| s.split(' ').map(str::as_bytes).collect::<Vec<_>>();
        let mut dag = DagBuilder::default();
        dag.load(b"in", t()).unwrap();
        let e = dag.add_words(&words("bad string"), &Fake).unwrap_err();
        assert_eq!(e.reply_text(), "DAG op should start with: '|>' ");
        let e = dag.add_words(&words("|> AI.MODELEXECUTE m INPUTS 1 in OUTPUTS 1 out |> bad_op x"), &Fake).unwrap_err();
        assert_eq!(e.reply_text(), "Unsupported command within DAG");
        assert_eq!(dag.num_ops(), 0);
        dag.add_words(&words("|> AI.MODELEXECUTE m1 INPUTS 1 in OUTPUTS 1 out |> AI.TENSORGET out"), &Fake).unwrap();
        assert_eq!(dag.num_ops(), 2);
        let plan = dag.plan().unwrap();
        assert!(matches!(plan.ops[0].kind, OpKind::Model { .. }));
        assert_eq!(&*plan.ops[0].device, "CPU:1");
        assert_eq!(get_slots(&plan).len(), 1);
    }

    #[test]
    fn a_call_plan_loads_its_inputs_in_order() {
        let mut op = model_op(&["i0"], &["o0"]);
        let plan = call_plan(&op, &[t()]).unwrap();
        assert_eq!(plan.loaded.len(), 1);
        assert_eq!(plan.ops[0].inputs(), &[plan.loaded[0].0]);
        op.inputs.clear();
        assert!(call_plan(&op, &[]).is_err());
    }
}
