"""``fairseq-sparse-recipe``: run the steps the user names, in order, then (step ``report``) gather every finished
model's results into WORK/results.json and render WORK/REPORT.md from it."""
import os
import signal
import time

from . import corpus, lengths, training
from .analyses import Analyses, layer_sparsity, valid_curve
from .decoding import Decoding, distinct_outputs, lead_baseline, same_hypotheses, significance
from .methods import BY_NAME, CONTROL_OF, METHODS, STEP_SUMMARY, STEPS, updates_of
from .option_checks import parse_args
from .options import fail
from .budget import budget_rows, decode_budget_points, plot_gap
from .gap_analysis import gap_analysis, kept_results
from .report import metric_name, plots_in, render
from .seqkd import distill_data
from .speed import speed, speed_results
from .workdir import StepLock, WorkDir, load_json, save_json
from ..checkpoint_safety import UnreadableCheckpoint
from ..cli.common import ToolError, check_writable


class Recipe:
    """One run of the recipe over a work dir: the steps, and the results the report is made of."""

    def __init__(self, args):
        self.a = args
        self.wd = WorkDir(args.work_dir, quiet=args.quiet, threads=args.threads)
        self.data = os.path.abspath(args.data_bin) if args.data_bin else self.wd.path("data-bin")
        self.dec = Decoding(args, self.wd, self.data)
        self.analyses = Analyses(self.dec)
        self.lengths = None

    def fit(self):
        """The models' positions from the prepared data, every length checked (once, before the first step
        after prepare: nothing is dropped, no test document skipped); what the report states of them."""
        if self.lengths is None:
            corpus.check_prepared(self.a, self.wd, self.data, keep=False)
            self.lengths = lengths.fit(self.a, self.wd, self.data)
        return self.lengths

    def step(self, name):
        if name != "prepare":
            self.fit()
        if name == "prepare":
            corpus.prepare(self.a, self.wd, self.data)
        elif name == "distill_data":
            distill_data(self.a, self.wd, self.data)
        elif name == "speed":
            speed(self.a, self.wd, self.data)
        elif name == "report":
            self.report()
        elif name == "gap_analysis":
            gap_analysis(self.a, self.dec, [m.name for m in METHODS if self.done(m)])
        elif name == "importance":
            training.importance(self.a, self.wd, self.data)
            self.analyses.evaluate(BY_NAME[name])
        else:
            training.train(self.a, self.wd, self.data, BY_NAME[name])
            self.analyses.evaluate(BY_NAME[name])
            decode_budget_points(self.a, self.dec, BY_NAME[name])

    def done(self, m):
        """Whether method M's model is complete."""
        if m.arch is None:
            return os.path.exists(self.wd.path("importance", "pruned.pt"))
        if not self.wd.finished(m.name, updates_of(m, self.a)):
            return False
        if not (m.name == "baseline" and self.a.baseline_checkpoint):
            # reported under this run's options only where it was made with them
            training.check_model(self.a, self.wd, m, training.train_command(self.a, self.wd, self.data, m))
        return True

    def results(self):
        """results.json's content: every finished model's evaluation and analyses, speed, plots, commands."""
        finished = [m for m in METHODS if self.done(m)]
        rows = {m.name: self.analyses.evaluate(m) for m in finished if m.decoding != "curve"}
        if "baseline" not in rows:
            fail("report: the baseline is not trained yet (run --steps baseline first)")
        speed_rows, noise = speed_results(self.wd)
        reported = [m for m in finished if m.name in rows]
        results = {"models": {n: {**{k: v for k, v in r.items() if k not in ("hypotheses", "references", "leads")},
                                  "distinct_outputs": distinct_outputs(r)} for n, r in rows.items()},
                   "lead": lead_baseline(self.a, rows["baseline"]),
                   "significance": significance(self.a, rows, CONTROL_OF),
                   "heads": {m.name: self.dec.heads_kept(m.name) for m in reported if m.heads_cut_out(self.a)},
                   "attention": {m.name: self.analyses.attention_analysis(m.name)
                                 for m in reported if m.attention_analysed},
                   "curve": self.analyses.curve_points() if any(m.decoding == "curve" for m in finished) else [],
                   "speed": [{"what": w, "ratio": r, "note": n} for w, r, n in speed_rows], "noise": noise,
                   "settings": vars(self.a), "lengths": self.fit(),
                   "stopped": {m.name: load_json(self.wd.path(m.name, "stopped.json"))
                               for m in reported if m.start is None and m.arch},
                   "timing": {m.name: load_json(self.wd.path(m.name, "timing.json"))
                              for m in reported if os.path.exists(self.wd.path(m.name, "timing.json"))},
                   "converged": self.converged(rows), "gap_analysis": kept_results(self.wd)}
        for m in reported:
            if m.full_memory:
                results[f"{m.name}_exact"] = same_hypotheses(rows[m.name], self.dec.full_memory(m))
            if m.decoding == "layered":
                results[f"{m.name}_layer_sparsity"] = layer_sparsity(self.wd, m.name)
        results["budget"] = budget_rows(self.a, self.dec, rows)
        if results["budget"]:
            plot_gap(self.wd, results["budget"], metric_name(self.a))
        results["plots"] = plots_in(self.wd.work)
        results["commands"] = {s: self.wd.commands(s) for s in STEPS if self.wd.commands(s)}
        return results

    def converged(self, rows):
        """How far from converged the baseline was: the equal-updates control's gain over the fine-tuning budget
        (a strong baseline gains little), and the baseline's valid loss over its last validations."""
        if "control" not in rows or self.a.baseline_checkpoint:
            return {}
        return {"control_gain": round(rows["control"]["score"] - rows["baseline"]["score"], 2),
                "finetune_updates": self.a.finetune_updates,
                "baseline_valid_curve": valid_curve(self.wd, "baseline")[-4:]}

    def report(self):
        """WORK/results.json, then WORK/REPORT.md rendered from it alone."""
        results = self.results()
        save_json(self.wd.path("results.json"), results)
        lines = render(results)
        path = self.wd.path("REPORT.md")
        with open(path + ".tmp", "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(path + ".tmp", path)
        end = lines.index("## Plots") if "## Plots" in lines else lines.index("## Commands")
        print("\n".join(lines[:end]))
        print(f"report: {path}")


def checked(argv=None):
    """The recipe of command line ARGV with every input checked (options, steps, the corpus or data-bin, and the
    lengths of prepared data); nothing written yet."""
    args = parse_args(argv)
    try:
        check_writable("--work-dir", args.work_dir)
    except ToolError as e:
        fail(str(e))
    recipe = Recipe(args)
    corpus.check_inputs(args, recipe.data)
    if os.path.isdir(recipe.data):  # a data-bin given or prepared already: its lengths checked before work too
        recipe.fit()
    return recipe


def main(argv=None):
    recipe = checked(argv)
    args = recipe.a
    os.makedirs(recipe.wd.work, exist_ok=True)  # after the checks: a refused run leaves nothing behind
    if os.path.isdir(recipe.data):  # the data's key, checked before, kept now
        corpus.check_prepared(args, recipe.wd, recipe.data)
    # SIGTERM and SIGHUP as Ctrl-C: the running command is stopped and the locks released (the handlers the
    # process had are put back at the end: main may run inside another program)
    before = {signum: signal.signal(signum, _interrupted) for signum in (signal.SIGTERM, signal.SIGHUP)}
    steps = list(dict.fromkeys(args.steps.split(",")))
    try:
        with StepLock(recipe.wd, steps):
            for step in steps:
                start = time.time()
                print(f"== {step}: {STEP_SUMMARY[step]}", flush=True)
                try:
                    recipe.step(step)
                except UnreadableCheckpoint as e:
                    fail(f"step {step}: {e}")
                print(f"   {step}: {time.time() - start:.0f}s", flush=True)
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def _interrupted(signum, frame):
    raise SystemExit(f"fairseq-sparse-recipe: stopped by signal {signal.Signals(signum).name}; a re-run resumes")


def cli_main():
    main()


if __name__ == "__main__":
    cli_main()
