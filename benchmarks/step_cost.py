"""Work per agent-step of metarl's PPO and PureJaxRL's ``ppo.py``, from XLA's compiled program.

XLA's own ``compiled.cost_analysis()`` counts a ``while`` loop's body once, whatever its
trip count, so for a trainer made of nested scans (updates > rollout steps, GAE steps,
epochs > minibatches) its totals are neither per step nor per run. This script reads the
optimised HLO text of ``jit(vmap(train))`` instead and counts every instruction as often as
it runs (each loop's ``known_trip_count``):

- **flops**: ``dot`` products (2 x output elements x contracted elements) and one per
  output element of every elementwise arithmetic, compare, select and reduce instruction,
  inside fusions too;
- **bytes**: what each top-level instruction (a fusion, a dot, a copy, a sort ...) reads and
  writes, as XLA's cost analysis counts them, except that slices of loop buffers count at
  the slice's size and in-place updates at the update's size;
- **instructions**: top-level instructions (each is roughly one kernel on a GPU).

Everything is divided by the agent-steps of the program and split by where it runs: the
rollout loop (``rollout``), the GAE loop (``gae``), the epoch loop outside its minibatch
steps (``shuffle``), the minibatch steps (``minibatch``), the rest of an update
(``update``) and everything outside the update loop (``outside``). The counts depend on the
backend's fusion decisions (run on the GPU too). ``xla_cost_analysis`` keeps XLA's own
(loop bodies once) numbers beside them.

    python benchmarks/step_cost.py --purejaxrl .cache/purejaxrl --out docs/results/step_cost.json
    python benchmarks/step_cost.py --smoke --purejaxrl .cache/purejaxrl   # small shapes

Prints (and with ``--out`` writes) one JSON document.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from vs_purejaxrl import CARTPOLE, MINATAR, load_purejaxrl, metarl_config, parse_variant

# settings compared (PureJaxRL's); each program trains one agent for UPDATES updates
SETTINGS = {"cartpole": CARTPOLE, "minatar": {**MINATAR, "ENV_NAME": "SpaceInvaders-MinAtar"}}
UPDATES = 3  # odd, so that no other loop of these programs shares the update loop's count
VARIANTS = ["default", "final_values=in_rollout", "final_values=none",
            "env_resets=in_step", "env_resets=presampled", "shuffle=permutation",
            "matmul=xla"]

DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
               "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
               "c128": 16, "token": 0}
ELEMENTWISE = {"add", "subtract", "multiply", "divide", "maximum", "minimum", "exponential",
               "log", "tanh", "sqrt", "rsqrt", "power", "negate", "abs", "compare", "select",
               "and", "or", "xor", "not", "clamp", "exponential-minus-one", "log-plus-one",
               "logistic", "sign", "floor", "ceil", "round-nearest-even", "round-nearest-afz",
               "remainder", "atan2", "cosine", "sine", "cbrt", "erf", "is-finite",
               "shift-left", "shift-right-logical", "shift-right-arithmetic", "popcnt"}
FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "call",
        "conditional", "after-all", "partition-id", "replica-id", "opt-barrier"}
SHAPE = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\]")
HEADER = re.compile(r"^(ENTRY\s+)?%(\S+)\s.*\{\s*$")


@dataclass
class Instruction:
    name: str
    opcode: str
    shape: str
    operands: list[str]
    attributes: str
    arguments: str = ""


@dataclass
class Computation:
    name: str
    instructions: dict[str, Instruction] = field(default_factory=dict)
    root: str | None = None


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape (a tuple's elements added)."""
    total = 0
    for dtype, dims in SHAPE.findall(shape):
        size = DTYPE_BYTES.get(dtype, 4)
        for dim in filter(None, dims.split(",")):
            size *= int(dim)
        total += size
    return total


def shape_elements(shape: str) -> int:
    match = SHAPE.search(shape)
    if not match:
        return 0
    return math.prod(int(d) for d in filter(None, match.group(2).split(",")))


def _split_type(text: str) -> tuple[str, str]:
    """``"(a, b) op(...)"`` or ``"f32[2]{0} op(...)"`` -> (type, rest)."""
    text = text.strip()
    if text.startswith("("):
        depth = 0
        for index, char in enumerate(text):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                return text[:index + 1], text[index + 1:].strip()
    type_, _, rest = text.partition(" ")
    return type_, rest.strip()


def _operands(text: str) -> tuple[list[str], str, str]:
    """The text after an opcode's ``(``: operand names, the attributes after the ``)`` and
    the raw text between (a parameter's number)."""
    depth, index = 1, 0
    while depth and index < len(text):
        depth += {"(": 1, ")": -1}.get(text[index], 0)
        index += 1
    inside = text[:index - 1]
    return re.findall(r"%([\w.\-]+)", inside), text[index:], inside


def parse_hlo(text: str) -> tuple[dict[str, Computation], str]:
    """The computations of an HLO module's text and the name of its entry."""
    computations: dict[str, Computation] = {}
    entry, current = "", None
    for line in text.splitlines():
        header = HEADER.match(line)
        if header and "=" not in line.split("(")[0]:
            current = Computation(header.group(2))
            computations[current.name] = current
            if header.group(1):
                entry = current.name
            continue
        if current is None or "=" not in line or not line.startswith("  "):
            continue
        left, _, right = line.partition("=")
        left = left.strip()
        is_root = left.startswith("ROOT ")
        name = left.removeprefix("ROOT ").strip().lstrip("%")
        type_, rest = _split_type(right)
        opcode, _, tail = rest.partition("(")
        operands, attributes, inside = _operands(tail)
        current.instructions[name] = Instruction(name, opcode.strip(), type_, operands,
                                                 attributes, inside.strip())
        if is_root:
            current.root = name
    return computations, entry


def _called(attributes: str, key: str) -> list[str]:
    match = re.search(key + r"=\{?([^}]*?)\}?(?:,\s*[a-z_]+=|$)", attributes)
    if not match:
        return []
    return re.findall(r"%([\w.\-]+)", match.group(1))


def trip_count(attributes: str) -> int | None:
    match = re.search(r'"known_trip_count":\{"n":"(\d+)"', attributes)
    return int(match.group(1)) if match else None


def _flops(instruction: Instruction, computation: Computation) -> float:
    if instruction.opcode == "dot":
        lhs = computation.instructions.get(instruction.operands[0])
        contracting = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", instruction.attributes)
        size = 1
        if lhs is not None and contracting:
            match = SHAPE.search(lhs.shape)
            dims = [int(d) for d in filter(None, match.group(2).split(","))] if match else []
            for axis in filter(None, contracting.group(1).split(",")):
                size *= dims[int(axis)] if int(axis) < len(dims) else 1
        return 2.0 * shape_elements(instruction.shape) * size
    if instruction.opcode in ELEMENTWISE:
        return float(shape_elements(instruction.shape))
    if instruction.opcode in ("reduce", "reduce-window"):
        first = computation.instructions.get(instruction.operands[0])
        return float(shape_elements(first.shape)) if first else 0.0
    return 0.0


def _fusion_bytes(instruction: Instruction, computation: Computation,
                  fused: Computation) -> float:
    """What a fusion reads and writes: each operand in full, except one read only through
    slices or gathers (their outputs' size) or updated in place (the update's size)."""
    parameters = {inner.name: int(inner.arguments) for inner in fused.instructions.values()
                  if inner.opcode == "parameter" and inner.arguments.isdigit()}
    users: dict[str, list[tuple[Instruction, int]]] = {name: [] for name in parameters}
    for inner in fused.instructions.values():
        for position, operand in enumerate(inner.operands):
            if operand in users:
                users[operand].append((inner, position))
    total = 0.0
    in_place = set()
    for name, index in parameters.items():
        if index >= len(instruction.operands):
            continue
        operand = computation.instructions.get(instruction.operands[index])
        full = shape_bytes(operand.shape) if operand else 0
        uses = users[name]
        if uses and all(user.opcode in ("dynamic-slice", "gather", "slice") and position == 0
                        for user, position in uses):
            total += sum(shape_bytes(user.shape) for user, _ in uses)
        elif any(user.opcode == "dynamic-update-slice" and position == 0
                 for user, position in uses):
            in_place.add(name)
        else:
            total += full
    root = fused.instructions.get(fused.root)
    outputs = ([fused.instructions.get(o) for o in root.operands]
               if root is not None and root.opcode == "tuple" else [root])
    for output in outputs:
        if output is None:
            continue
        if output.opcode == "dynamic-update-slice":
            update = fused.instructions.get(output.operands[1])
            total += 2 * shape_bytes(update.shape) if update else 0
        else:
            total += shape_bytes(output.shape)
    return total


def _bytes(instruction: Instruction, computation: Computation,
           computations: dict[str, Computation]) -> float:
    if instruction.opcode in FREE:
        return 0.0
    if instruction.opcode == "fusion":
        fused = computations.get(next(iter(_called(instruction.attributes, "calls")), ""))
        if fused is not None:
            return _fusion_bytes(instruction, computation, fused)
    if instruction.opcode in ("dynamic-slice", "slice", "gather"):
        return 2.0 * shape_bytes(instruction.shape)
    if instruction.opcode == "dynamic-update-slice":
        update = computation.instructions.get(instruction.operands[1])
        return 2.0 * shape_bytes(update.shape) if update else 0.0
    operands = sum(shape_bytes(computation.instructions[o].shape)
                   for o in instruction.operands if o in computation.instructions)
    return float(operands + shape_bytes(instruction.shape))


@dataclass
class Tally:
    flops: float = 0.0
    bytes: float = 0.0
    instructions: float = 0.0
    dots: float = 0.0

    def add(self, other: Tally, weight: float = 1.0) -> None:
        self.flops += weight * other.flops
        self.bytes += weight * other.bytes
        self.instructions += weight * other.instructions
        self.dots += weight * other.dots


def count(text: str, label) -> tuple[dict[str, Tally], list[str]]:
    """Every instruction of the module ``text`` weighted by how often it runs, tallied by
    ``label(loops)``, where ``loops`` lists the trip counts of the enclosing loops (outermost
    first) and whether each loop's body does a dot product. Returns the tallies and notes
    (loops of unknown trip count, counted once; conditional branches, each counted)."""
    computations, entry = parse_hlo(text)
    tallies: dict[str, Tally] = {}
    notes: list[str] = []
    dots_in: dict[str, bool] = {}

    def has_dot(name: str, seen=()) -> bool:
        if name in dots_in:
            return dots_in[name]
        found = False
        for inner in computations[name].instructions.values():
            if inner.opcode == "dot":
                found = True
            for key in ("calls", "body", "to_apply", "branch_computations"):
                for callee in _called(inner.attributes, key):
                    if callee in computations and callee not in seen:
                        found = found or has_dot(callee, (*seen, name))
        dots_in[name] = found
        return found

    def fused_flops(name: str) -> float:
        fused = computations[name]
        total = 0.0
        for inner in fused.instructions.values():
            total += _flops(inner, fused)
            for callee in _called(inner.attributes, "calls"):
                if callee in computations:
                    total += fused_flops(callee)
        return total

    def walk(name: str, weight: float, loops: tuple) -> None:
        computation = computations[name]
        tally = tallies.setdefault(label(loops), Tally())
        for instruction in computation.instructions.values():
            op = instruction.opcode
            if op == "while":
                body = _called(instruction.attributes, "body")[0]
                condition = _called(instruction.attributes, "condition")[0]
                trips = trip_count(instruction.attributes)
                if trips is None:
                    notes.append(f"{instruction.name}: unknown trip count, counted once")
                    trips = 1
                inner_loops = (*loops, (trips, has_dot(body)))
                walk(body, weight * trips, inner_loops)
                walk(condition, weight * (trips + 1), inner_loops)
                continue
            if op == "conditional":
                branches = (_called(instruction.attributes, "branch_computations")
                            or _called(instruction.attributes, "true_computation")
                            + _called(instruction.attributes, "false_computation"))
                notes.append(f"{instruction.name}: {len(branches)} branches, each counted")
                for branch in branches:
                    walk(branch, weight, loops)
                continue
            if op == "call":
                for callee in _called(instruction.attributes, "to_apply"):
                    walk(callee, weight, loops)
                continue
            own = Tally(instructions=0.0 if op in FREE else 1.0)
            own.flops = _flops(instruction, computation)
            if op == "fusion":
                for callee in _called(instruction.attributes, "calls"):
                    if callee in computations:
                        own.flops += fused_flops(callee)
                        own.dots += sum(i.opcode == "dot"
                                        for i in computations[callee].instructions.values())
            own.dots += op == "dot"
            own.bytes = _bytes(instruction, computation, computations)
            tally.add(own, weight)

    walk(entry, 1.0, ())
    return tallies, sorted(set(notes))


def ppo_section(updates: int, num_steps: int, epochs: int, minibatches: int):
    """The ``label`` of :func:`count` for a PPO trainer: where in an update a loop is."""

    def label(loops: tuple) -> str:
        if not loops:
            return "outside"
        path = list(loops)
        while path and path[0][0] != updates:  # e.g. a loop over chunks of agents
            path.pop(0)
        if not path:
            return "outside"
        if len(path) == 1:
            return "update"
        trips, dot = path[1]
        if trips == epochs and len(path) >= 3 and path[2][0] == minibatches:
            return "minibatch"
        if trips == epochs:
            return "shuffle"
        if trips in (num_steps, num_steps // 16) and dot:  # PureJaxRL unrolls GAE by 16
            return "rollout"
        if trips in (num_steps, num_steps // 16):
            return "gae"
        return "update"

    return label


def analyse(train, settings: dict, agents: int, agent_steps: int) -> dict:
    """Per agent-step counts of ``jit(vmap(train))`` over ``agents`` keys."""
    import jax

    keys = jax.random.split(jax.random.PRNGKey(0), agents)
    started = time.perf_counter()
    compiled = jax.jit(jax.vmap(train)).lower(keys).compile()
    compile_seconds = time.perf_counter() - started
    xla = compiled.cost_analysis()
    xla = xla[0] if isinstance(xla, list) else xla
    label = ppo_section(UPDATES, settings["NUM_STEPS"], settings["UPDATE_EPOCHS"],
                        settings["NUM_MINIBATCHES"])
    tallies, notes = count(compiled.as_text(), label)
    total = Tally()
    for tally in tallies.values():
        total.add(tally)
    per_step = agents * agent_steps
    rollout_steps = agents * UPDATES * settings["NUM_STEPS"]

    def per(tally: Tally) -> dict:
        return {"flops": round(tally.flops / per_step), "bytes": round(tally.bytes / per_step),
                "instructions_per_agent_step": round(tally.instructions / per_step, 4)}

    return {
        "jax": jax.__version__, "backend": jax.default_backend(),
        "compile_seconds": round(compile_seconds, 2),
        "flops_per_agent_step": round(total.flops / per_step),
        "bytes_per_agent_step": round(total.bytes / per_step),
        "sections": {name: per(tally) for name, tally in sorted(tallies.items())},
        # per rollout step of one agent (all its environments): roughly the kernels a GPU
        # launches per step when one agent runs alone
        "rollout_instructions_per_step": round(
            tallies.get("rollout", Tally()).instructions / rollout_steps, 2),
        "xla_cost_analysis": {"flops": xla.get("flops"),
                              "bytes_accessed": xla.get("bytes accessed"),
                              "note": "XLA's own count: every loop body once"},
        "notes": notes,
    }


def build(side: str, settings: dict, variant: str, purejaxrl: Path):
    batch = settings["NUM_ENVS"] * settings["NUM_STEPS"]
    steps = UPDATES * batch
    if side == "purejaxrl":
        module = load_purejaxrl(purejaxrl)
        train = module.make_train({**settings, "TOTAL_TIMESTEPS": steps})
        return (lambda key: train(key)["metrics"]), steps
    from inner_loops import make_train

    return make_train(metarl_config(settings, steps, parse_variant(variant))), steps


def generation_cost(smoke: bool) -> dict:
    """What the jitted evolution generation of ``experiments/value_distance_cartpole.toml``
    counts beyond the plain ``jit(vmap(train))`` of the same agents (same objective, each
    agent with its own meta-parameters): the work inside the training loops, and outside
    them (initialisation, the ES's ask and tell, fitness, the best so far), in absolute
    counts per generation and per agent-step."""
    import tomllib

    import jax

    from inner_loops.population import broadcast_to_population
    from metarl.config import apply_overrides
    from metarl.evolve.config import config_from_dict
    from metarl.evolve.generation import Evolution

    batch = CARTPOLE["NUM_ENVS"] * CARTPOLE["NUM_STEPS"]
    candidates, seeds = (2, 1) if smoke else (8, 2)
    data = apply_overrides(
        tomllib.loads((Path(__file__).resolve().parent.parent / "experiments"
                       / "value_distance_cartpole.toml").read_text()),
        [f"es.population_size={candidates}", f"fitness.seeds_per_candidate={seeds}",
         f"inner.total_timesteps={UPDATES * batch}", "run.progress=false",
         "run.shard=false"])
    evolution = Evolution(config_from_dict(data))
    state = evolution.init()
    agents = candidates * seeds
    keys = jax.random.split(jax.random.PRNGKey(1), agents)
    meta = broadcast_to_population(evolution.mean_meta_params(state), agents)
    hypers = broadcast_to_population(evolution.config.inner[0].hyperparams(), agents)
    label = ppo_section(UPDATES, CARTPOLE["NUM_STEPS"], CARTPOLE["UPDATE_EPOCHS"],
                        CARTPOLE["NUM_MINIBATCHES"])
    programs = {
        "generation": evolution.step.lower(state).compile(),
        "plain_training": jax.jit(jax.vmap(evolution.learners[0].train)).lower(
            keys, meta, hypers).compile(),
    }
    agent_steps = agents * UPDATES * batch
    result: dict = {"experiment": "experiments/value_distance_cartpole.toml",
                    "candidates": candidates, "seeds_per_candidate": seeds,
                    "steps_per_agent": UPDATES * batch, "agent_steps": agent_steps}
    for name, compiled in programs.items():
        tallies, notes = count(compiled.as_text(), label)
        inside, outside = Tally(), Tally()
        for section, tally in tallies.items():
            (outside if section == "outside" else inside).add(tally)
        result[name] = {
            "inside_training_loops": {"flops": inside.flops, "bytes": inside.bytes,
                                      "instructions": inside.instructions},
            "outside_training_loops": {"flops": outside.flops, "bytes": outside.bytes,
                                       "instructions": outside.instructions},
            "flops_per_agent_step": round((inside.flops + outside.flops) / agent_steps),
            "notes": notes,
        }
    gen, plain = result["generation"], result["plain_training"]
    result["generation_over_plain"] = {
        kind: round((gen["inside_training_loops"][kind] + gen["outside_training_loops"][kind])
                    / (plain["inside_training_loops"][kind]
                       + plain["outside_training_loops"][kind]), 4)
        for kind in ("flops", "bytes")}
    result["extra_outside_per_generation"] = {
        kind: gen["outside_training_loops"][kind] - plain["outside_training_loops"][kind]
        for kind in ("flops", "bytes", "instructions")}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--purejaxrl", type=Path,
                        help="the folder holding PureJaxRL's ppo.py and wrappers.py")
    parser.add_argument("--settings", nargs="+", choices=sorted(SETTINGS),
                        default=list(SETTINGS))
    parser.add_argument("--variants", nargs="+", default=VARIANTS)
    parser.add_argument("--agents", type=int, default=1)
    parser.add_argument("--smoke", action="store_true",
                        help="8 steps x 4 envs per update: checks the script end to end")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--generation", action="store_true",
                        help="instead: the evolution generation against plain training")
    parser.add_argument("--single", nargs=3, metavar=("SIDE", "SETTINGS", "VARIANT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generation:
        import jax

        report = {"benchmark": "step_cost --generation",
                  "command": " ".join(["python", "benchmarks/step_cost.py"] + sys.argv[1:]),
                  "jax": jax.__version__, "backend": jax.default_backend(),
                  **generation_cost(args.smoke)}
        text = json.dumps(report, indent=1)
        if args.out:
            args.out.write_text(text + "\n")
        print(text)
        return
    if args.single:
        side, name, variant = args.single
        settings = dict(SETTINGS[name])
        if args.smoke:
            settings.update(NUM_STEPS=16, NUM_ENVS=4)
        train, steps = build(side, settings, variant, args.purejaxrl)
        print(json.dumps(analyse(train, settings, args.agents, steps)))
        return
    if args.purejaxrl is None:
        parser.error("--purejaxrl FOLDER is required (PureJaxRL's ppo.py and wrappers.py)")
    import subprocess

    # this process never starts JAX (an accelerator's memory stays the children's); the
    # version and backend come from the first child's answer
    report = {"benchmark": "step_cost",
              "command": " ".join(["python", "benchmarks/step_cost.py"] + sys.argv[1:]),
              "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "jax": None, "backend": None,
              "agents": args.agents, "updates": UPDATES, "smoke": args.smoke,
              "settings": {}}
    for name in args.settings:
        rows = {}
        for side, variant in [("purejaxrl", "-")] + [("metarl", v) for v in args.variants]:
            command = [sys.executable, __file__, "--single", side, name, variant,
                       "--purejaxrl", str(args.purejaxrl), "--agents", str(args.agents)]
            out = subprocess.run(command + (["--smoke"] if args.smoke else []),
                                 capture_output=True, text=True)
            label = "purejaxrl" if side == "purejaxrl" else f"metarl:{variant}"
            rows[label] = (json.loads(out.stdout.strip().splitlines()[-1])
                           if out.returncode == 0 else {"error": out.stderr[-2000:]})
            if report["jax"] is None and "jax" in rows[label]:
                report["jax"], report["backend"] = rows[label]["jax"], rows[label]["backend"]
            print(label, json.dumps(rows[label])[:300], file=sys.stderr, flush=True)
        base = rows.get("purejaxrl", {})
        for row in rows.values():
            if "flops_per_agent_step" in row and "flops_per_agent_step" in base:
                row["over_purejaxrl"] = {
                    "flops": round(row["flops_per_agent_step"] / base["flops_per_agent_step"],
                                   3),
                    "bytes": round(row["bytes_per_agent_step"] / base["bytes_per_agent_step"],
                                   3)}
        report["settings"][name] = {"purejaxrl_config": {**SETTINGS[name]}, "programs": rows}
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
