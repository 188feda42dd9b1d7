"""Does tests/test_hire_reference.py pin HIRE's wiring? Apply one-token slips, one at a time, to
deepen_run/methods/hire/model.py in a scratch copy of the checkout (the checkout itself is never
touched) and check that the reference tests fail for each. A slip whose text is no longer in the
model stops the script (the assert): update it with the model.   PYTHONPATH=. python scripts/hire_mutations.py
"""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SRC = str(Path(__file__).resolve().parent.parent)
SCRATCH = os.path.join(tempfile.mkdtemp(prefix="hire-mutations-"), "tree")
RANGE = "range(0 if cfg.include_embeddings else 1, L)"
# The fusion's input as the extractor path builds it (the extractor=false control builds its own).
CAT = "fused = self.fuse(torch.cat([last, a, last + a, last * a], dim=-1)"
SCORES = "scores = self.score(s).view(J, B).t()"
SOFTMAX = "torch.float32)).softmax(dim=-1)"
M = [  # (what, original text in hire.py, its slip)
    ("layer range includes H_L", RANGE, RANGE.replace(", L)", ", L + 1)")),
    ("layer range starts at 2", RANGE, RANGE.replace("else 1", "else 2")),
    ("layer range stops at L-2", RANGE, RANGE.replace(", L)", ", L - 1)")),
    ("embeddings always read", RANGE, RANGE.replace("else 1", "else 0")),
    ("embeddings never read", RANGE, RANGE.replace("(0 if", "(1 if")),
    ("stack hs[j + 1]", "[hs[j] for j in self.layer_ids]", "[hs[j + 1] for j in self.layer_ids]"),
    ("R = hs[-2]", "block(layers, hs[-1], attention_mask)", "block(layers, hs[-2], attention_mask)"),
    ("R = A", CAT, CAT.replace("[last, a, last + a, last * a]", "[a, a, a + a, a * a]")),
    ("M = [R;A;R-A;R*A]", CAT, CAT.replace("last + a", "last - a")),
    ("M = [A;R;R+A;R*A]", CAT, CAT.replace("[last, a,", "[a, last,")),
    ("M = [R;A;R*A;R+A]", CAT, CAT.replace("last + a, last * a", "last * a, last + a")),
    ("M = [R;A;R+A;R+A]", CAT, CAT.replace("last * a", "last + a")),
    ("softmax over the batch", SOFTMAX, SOFTMAX.replace("dim=-1", "dim=0")),
    ("softmax missing", SOFTMAX, "torch.float32))"),
    ("scores reshaped (B, J)", SCORES, "scores = self.score(s).view(B, J)"),
    ("mean summary over padding", "s = out.sum(1) / lengths.unsqueeze(-1).to(out.dtype)", "s = out.mean(1)"),
    ("A from alpha transposed layers", 'torch.einsum("bj,jbtd->btd"', 'torch.einsum("bj,jbtd->bjd"'),
]
env = {**os.environ, "PYTHONPATH": SCRATCH}
results = []
for name, old, new in M:
    shutil.rmtree(SCRATCH, ignore_errors=True)
    shutil.copytree(SRC, SCRATCH, ignore=shutil.ignore_patterns(".git", "outputs", "__pycache__", ".venv"))
    p = f"{SCRATCH}/deepen_run/methods/hire/model.py"
    s = open(p).read()
    assert s.count(old) == 1, (name, s.count(old))
    open(p, "w").write(s.replace(old, new))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                        "tests/test_hire_reference.py"],
                       cwd=SCRATCH, env=env, capture_output=True, text=True, timeout=600)
    tail = r.stdout.strip().splitlines()[-1]
    results.append((name, r.returncode, tail))
    print(f"{name:34s} rc={r.returncode}  {tail}", flush=True)
shutil.rmtree(SCRATCH, ignore_errors=True)
survived = [name for name, rc, _ in results if rc == 0]
print("all caught" if not survived else f"survived: {survived}")
sys.exit(1 if survived else 0)
