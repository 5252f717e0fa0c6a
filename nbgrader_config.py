"""nbgrader 0.9.6 configuration of the course: the one place nbgrader is set up.

Read by every nbgrader command run from this folder, by `make lab`'s Validate
button, and by the grader package (grader/course.py loads this file).
"""
import os
import sys

# nbgrader runs `alembic` (for a new gradebook) from PATH: this environment's, activated or not.
_bin = os.path.dirname(sys.executable)
_path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p not in ("", _bin)]
os.environ["PATH"] = os.pathsep.join([_bin, *_path])

c = get_config()  # noqa: F821 - provided by nbgrader's config loader

# The course root is the folder of this file, wherever the repository is cloned.
c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.course_id = "attention-from-scratch"
c.CourseDirectory.source_directory = "solutions"
# nbgrader's own release (generate_assignment, release_assignment) goes to release/,
# git-ignored; notebooks/ holds the committed student versions, written by `make release`.
c.CourseDirectory.release_directory = "release"
# Student versions end with the check-my-work cells: nbgrader's preprocessors, then ours.
# First, the release order (grader/release.py): a notebook whose read-only helper cells copy
# the answers of an assignment still open in the gradebook (no due date, or one or an
# extension still to come) is refused, with the reason as the log's first error; otherwise
# the log says which assignments it copies. To release it anyway:
# nbgrader generate_assignment ID --ReleaseOrder.force=True (or c.ReleaseOrder.force = True).
c.GenerateAssignment.preprocessors = [
    "grader.release.ReleaseOrder",
    "nbgrader.preprocessors.IncludeHeaderFooter",
    "nbgrader.preprocessors.InstantiateTests",
    "nbgrader.preprocessors.LockCells",
    "nbgrader.preprocessors.ClearSolutions",
    "nbgrader.preprocessors.ClearOutput",
    "nbgrader.preprocessors.CheckCellMetadata",
    "nbgrader.preprocessors.ComputeChecksums",
    "nbgrader.preprocessors.SaveCells",
    "nbgrader.preprocessors.ClearHiddenTests",
    "nbgrader.preprocessors.ClearMarkScheme",
    "nbgrader.preprocessors.ComputeChecksums",
    "nbgrader.preprocessors.CheckCellMetadata",
    "grader.release.AddCheckCells",
]

# Submission timestamps are read and written in UTC.
c.Exchange.timezone = "UTC"

# Execution while grading. Every notebook must run in 30 s while graded
# (exercise-standard.md). The limits count the kernel's own CPU time, all its processes
# together (grader/execute.py), never the wall clock, so a correct notebook keeps its
# points on a busy machine or beside a greedy classmate: 45 CPU-s a cell and 60 CPU-s a
# notebook (an endless loop costs one submission a minute of CPU, not a minute per cell
# that calls it). Sleeping or waiting instead of computing is bounded by idle time (none
# of the kernel's threads running or waiting for a CPU): 45 s a cell, 60 s a notebook.
# The wall clock is only a backstop, three times the CPU limits: 135 s a cell, 180 s a
# notebook. The kernel is always this environment's "python3", whatever a student's
# notebook says.
c.BudgetedExecute.cell_cpu_seconds = 45
c.BudgetedExecute.notebook_cpu_seconds = 60
c.BudgetedExecute.cell_idle_seconds = 45
c.BudgetedExecute.notebook_idle_seconds = 60
c.BudgetedExecute.wall_factor = 3.0
c.Execute.startup_timeout = 120
c.Execute.interrupt_on_timeout = True
c.Execute.kernel_name = "python3"
# nbgrader's default for Python kernels, plus: keep the kernel's own start-up notices
# (e.g. about its loopback TCP transport) out of the instructor's terminal.
c.Execute.extra_arguments = ["--HistoryManager.hist_file=:memory:", "--IPKernelApp.log_level=ERROR"]
# The kernel's limits hold for all its processes together, in a cgroup (grader/cgroup.py)
# when the grader is root (else per process, after a loud warning): 4096 MiB of memory,
# 256 processes, and one core's worth of CPU, so that a submission's background
# processes count against it alone and cannot slow down a classmate graded beside it.
c.SandboxedKernelManager.memory_mb = 4096
c.SandboxedKernelManager.processes = 256
c.SandboxedKernelManager.cpus = 1.0
# One bound for a submission's whole unit of work (staging, execution, feedback), counted
# on the worker (grader/parallel.py): past it the row says "not graded: grading took
# longer than 420 s ..." and the worker is restarted. An honest unit takes well under a
# minute; this is the notebook's wall-clock backstop (180 s), the kernel's start-up limit
# (120 s) and room for staging and feedback on a busy machine. A unit that trips a time
# limit (this one included) while other units run beside it or the machine is busy is
# graded again alone before a failure is recorded (UnitLimits.regrade_alone).
c.UnitLimits.seconds = 420
# Grades are decided outside the student's kernel (grader/verify.py): questions go in
# before execution, answers are judged after it; the kernel runs sandboxed
# (grader/sandbox.py) with CPU-time limits and output limits (grader/execute.py).
c.Autograde.autograde_preprocessors = [
    "grader.verify.AskQuestions",
    "grader.execute.BudgetedExecute",  # in place of nbgrader.preprocessors.Execute
    "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "grader.verify.SaveVerifiedGrades",  # in place of nbgrader.preprocessors.SaveAutoGrades
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]

# Python warnings printed on stderr (PyTorch prints some) are dropped from the graded
# notebook, so feedback is not cluttered ("file.py:12: UserWarning: ...").
c.IgnorePattern.enabled = True
c.IgnorePattern.pattern = r"^[^\n]*:\d+: \w*Warning: "

# A test cell the student deleted is put back from the source and graded.
c.OverwriteCells.add_missing_cells = True

# Feedback reads like a tutor's comments: a summary at the top (score, per exercise the
# points, the diagnosis and a hint, what to revisit), the comment under each test cell,
# the learner's own figures in place; never hidden test code or grader tracebacks.
# `nbgrader generate_feedback` after manual grading must rewrite the feedback that
# course-grader grade wrote (formgrader's button always does): without this it skips it.
c.GenerateFeedback.force = True
# nbconvert's HTML exporter, with each template compiled once per process (not once a page)
c.GenerateFeedback.exporter_class = "grader.feedback.FeedbackExporter"
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "grader.feedback.ExplainFailures",
    "nbgrader.preprocessors.ClearHiddenTests",
    "grader.tutor.TutorSummary",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]

# Lateness: the due date is the gradebook's (nbgrader db assignment add ... --duedate, or
# course-grader grade --duedate), a student's extension is nbgrader's (course-grader grade
# --extensions); the submission time is the one `nbgrader collect` records from the
# exchange, which the student cannot forge (grader/README.md), never the student's own
# timestamp.txt. A late submission scores 0; set "none" to only record how late it was.
c.LateSubmissionPlugin.penalty_method = "zero"

# The secret that seeds every student's hidden inputs (grader/verify.py). Created on
# first use; keep it out of the repository and readable by the grader only.
# c.CourseSecret.secret_file = "/home/instructor/.attention-course-secret"

# Every HTML page nbconvert makes from the workspace (the feedback, formgrader's view of
# an autograded notebook) treats what a student wrote as data (grader/sanitize.py):
# markdown, the graders' comments and text/html or text/markdown outputs keep prose,
# headings, tables, math and data: images and lose scripts, event handlers, embeds,
# forms, styles and any URL that would fetch something; JavaScript and widget outputs
# are dropped; image sizes are numbers; SVG stays an <img> (no script runs in one).
# Each cell's rendering is also inert in the page: its ids move to user-content-*, its
# classes are only the renderers' own, and it is drawn in a box of its own.
# Formgrader builds HTMLExporter(config=...) from this file, nbgrader's feedback too.
c.HTMLExporter.sanitize_html = True
c.HTMLExporter.skip_svg_encoding = False
c.HTMLExporter.filters = {
    "clean_html": "grader.sanitize.student_html",
    "markdown2html": "grader.sanitize.MarkdownToSafeHTML",
}
c.HTMLExporter.preprocessors = ["grader.sanitize.SanitizeOutputs"]
# Feedback typesets its math offline: MathJax 2 from the Jupyter server that shows the
# page (the pinned jupyter_server_mathjax extension), not nbconvert's CDN. The course's
# templates come first and hold only grader/templates/feedback/mathjax.html.j2, which
# shadows nbconvert's macro; nbgrader's own feedback template does the rest, as when
# GenerateFeedback sets these folders itself.
import grader as _grader  # noqa: E402 - nbgrader loads this file with the course importable
import nbgrader as _nbgrader  # noqa: E402

c.HTMLExporter.extra_template_basedirs = [
    os.path.join(os.path.dirname(_grader.__file__), "templates"),
    os.path.join(os.path.dirname(_nbgrader.__file__), "server_extensions", "formgrader", "templates"),
]

# formgrader's Autograde button runs course-grader grade for its row, as a grading run
# grades it (a renamed notebook, a copied cell, the trusted time), and never deletes a
# graded copy (grader/formgrading.py); nothing changes where formgrader is not running.
from grader.formgrading import install as _formgrader_autogrades_with_course_grader  # noqa: E402

_formgrader_autogrades_with_course_grader()

# `nbgrader export` writes grades.csv, the whole gradebook with each row's status, as
# course-grader grade does after every run (grader/gradetable.py).
c.ExportApp.plugin_class = "grader.gradetable.GradeTable"

# `nbgrader collect` and formgrader's Collect button (grader/exchange.py): a submission is
# collected only from a folder its student owns; its time is the latest change time in it
# (not the folder name or timestamp.txt, which the student's process wrote), written to
# its timestamp.txt and to submission_times.csv in the course root; links and special
# files are never copied.
c.ExchangeFactory.collect = "grader.exchange.TrustedCollect"
# `nbgrader release_feedback` and formgrader's Release Feedback button release each
# notebook's feedback under the name the student submitted it as (a renamed notebook is
# graded as the released one), which is the name the student's fetch_feedback looks for.
c.ExchangeFactory.release_feedback = "grader.exchange.ReleaseFeedbackAsSubmitted"
