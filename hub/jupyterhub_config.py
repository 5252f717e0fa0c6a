"""JupyterHub 6 configuration of the course hub (hub/launch.py writes the settings it reads).

What a real deployment sets the same way: PAM logins of real local accounts, each
single-user server started as its user by LocalProcessSpawner from an environment
chosen by who logs in (the students': no grader package, no solutions, no formgrader; the
instructor's: the course installed, formgrader on ~instructor/course), loopback only, and
the check-my-work service ``course-check`` run by the hub as the instructor.
"""
import json
import os
from pathlib import Path

c = get_config()  # noqa: F821 - provided by JupyterHub's config loader

settings = json.loads(Path(os.environ["COURSE_HUB_SETTINGS"]).read_text())
state = Path(settings["state"])
instructor, students = settings["instructor"], settings["students"]
envs = {instructor: Path(settings["instructor_python"]).parent}
envs.update({s: Path(settings["student_python"]).parent for s in students})

# Loopback only: the public proxy, the hub's own API and the proxy's API.
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = settings["port"]
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = settings["hub_port"]
c.ConfigurableHTTPProxy.command = [settings["proxy"]]
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{settings['proxy_api_port']}"
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
# the proxy runs in a session of its own: hub/launch.py stops it by this pid even if the hub died
c.ConfigurableHTTPProxy.pid_file = settings["proxy_pid_file"]

# Real local accounts, their Unix passwords (PAM); only the course's accounts may log in.
c.JupyterHub.authenticator_class = "pam"
c.Authenticator.allowed_users = {instructor, *students}
c.Authenticator.admin_users = {instructor}

c.JupyterHub.spawner_class = "localprocess"
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.Spawner.args = settings["spawner_args"]
# Nothing of the hub's own environment (root's venv on PATH, PYTHONPATH) reaches a user's server.
c.Spawner.env_keep = ["LANG", "LC_ALL", "TZ"]


def choose_environment(spawner):
    """Each user's server, kernels and terminals from their own environment."""
    bin_dir = envs[spawner.user.name]
    spawner.cmd = [str(bin_dir / "jupyterhub-singleuser")]
    spawner.environment = dict(spawner.environment, PATH=f"{bin_dir}:{settings['path']}")


c.Spawner.pre_spawn_hook = choose_environment

# Check my work (grader/checkservice.py): a service the hub runs as the instructor, who alone
# can read the references; students' kernels call it with their server's token
# (JUPYTERHUB_API_TOKEN), which must hold access:services!service=course-check: asked for in
# server_token_scopes and held through the user role (replacing the role drops "self" unless
# it is listed again).
course_grader = envs[instructor] / "course-grader"
c.JupyterHub.services = [{
    "name": "course-check",
    "user": instructor,
    "url": f"http://127.0.0.1:{settings['check_port']}",
    "command": [str(course_grader), "serve-checks"],
    "environment": {"PATH": f"{envs[instructor]}:{settings['path']}"},
}]
c.Spawner.environment = {"COURSE_CHECK_URL": f"http://127.0.0.1:{settings['port']}/services/course-check/"}
c.Spawner.server_token_scopes = ["users:activity!user", "access:servers!server",
                                 "access:services!service=course-check"]
c.JupyterHub.load_roles = [{"name": "user", "scopes": ["self", "access:services!service=course-check"]}]
