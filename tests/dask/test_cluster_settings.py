"""Cluster settings: TLS on a local cluster, the SLURM job script, and policy validation."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import pytest
from pydantic import ValidationError

from habitrun.engine.dask_backend import DaskBackend
from habitrun.engine.dask_backend.batching import BatchSizer
from habitrun.engine.dask_backend.cluster import make_jobqueue_cluster, security_for
from habitrun.spec.policy import DaskSettings, JobqueueSettings, RunPolicy
from tests.dask.conftest import dask_policy, echo_op, make_tasks, run_all

pytestmark = [pytest.mark.dask]


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a certificate for 127.0.0.1 signed by it (PEM files)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "habitrun test CA")])
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "habitrun-node")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_file, cert_file, key_file = folder / "ca.pem", folder / "node.pem", folder / "node.key"
    ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return ca_file, cert_file, key_file


@pytest.mark.timeout(150)
def test_local_cluster_with_generated_tls_certificates(ops_dir: Path, tmp_path: Path) -> None:
    ca, cert, key = make_certificates(tmp_path)
    policy = dask_policy(dask={"tls": {"ca_file": str(ca), "cert": str(cert), "key": str(key)}})
    with DaskBackend.from_policy(policy) as backend:
        seen = run_all(backend, echo_op(ops_dir), make_tasks(tmp_path, 6))
        assert all(o.ok for o in seen.values())
        assert backend.describe()["address"].startswith("tls://127.0.0.1:")
        # a client without the certificates is refused
        from distributed import Client

        with pytest.raises(Exception):  # noqa: B017 - distributed raises OSError or TimeoutError by version
            Client(backend.describe()["address"].replace("tls://", "tcp://"), timeout=3)


def test_tls_settings_become_a_dask_security_object(tmp_path: Path) -> None:
    settings = DaskSettings(address="tls://10.0.0.5:8786",
                            tls={"ca_file": "/c/ca.pem", "cert": "/c/me.pem", "key": "/c/me.key"})
    sec = security_for(settings, local=False)
    assert sec.require_encryption
    assert (sec.tls_ca_file, sec.tls_client_cert, sec.tls_client_key) == ("/c/ca.pem", "/c/me.pem", "/c/me.key")


@pytest.mark.timeout(60)
def test_slurm_job_script_has_what_the_policy_says() -> None:
    policy = RunPolicy(backend="dask", workers=8, worker_threads=2, dask={"jobqueue": {
        "system": "slurm", "cores": 4, "memory": "16GB", "walltime": "02:30:00", "queue": "short",
        "account": "lung-study", "python": "/opt/study/venv/bin/python",
        "job_extra_directives": ["--constraint=avx2"], "job_script_prologue": ["module load gcc"],
    }})
    cluster, cancelled = make_jobqueue_cluster(policy.dask.jobqueue, policy, security_for(policy.dask, local=False))
    assert cancelled == []
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    assert "#SBATCH -J habitrun-worker" in script
    assert "#SBATCH -A lung-study" in script
    assert "#SBATCH -p short" in script
    assert "#SBATCH -t 02:30:00" in script
    assert "#SBATCH --cpus-per-task=4" in script
    assert "#SBATCH --mem=15G" in script  # dask-jobqueue writes GiB
    assert "#SBATCH --constraint=avx2" in script
    assert "module load gcc" in script and "export OMP_NUM_THREADS=2" in script
    command = script.strip().splitlines()[-1]
    assert command.startswith("/opt/study/venv/bin/python -m distributed.cli.dask_worker tcp://")
    assert "--nthreads 1" in command and "--nworkers 4" in command
    assert "--memory-limit 3.73GiB" in command
    assert "--nanny" in command and "--death-timeout 120" in command


@pytest.mark.parametrize(("fields", "message"), [
    ({"backend": "process", "dask": {}}, "need backend 'dask'"),
    ({"backend": "dask", "cap_workers_to_gpu_pool": True}, "CUDA_VISIBLE_DEVICES"),
    ({"backend": "dask", "dask": {"address": "tcp://a:1", "scheduler_file": "s.json"}}, "at most one"),
    ({"backend": "dask", "dask": {"address": "http://a:1"}}, "unknown protocol"),
    ({"backend": "dask", "dask": {"address": "tcp://a:1", "tls": {"ca_file": "c", "cert": "c"}}}, "tls://"),
    ({"backend": "dask", "dask": {"jobqueue": {"cores": 8, "processes": 2}}}, "processes must equal cores"),
    ({"backend": "dask", "dask": {"jobqueue": {"system": "htcondor", "queue": "q"}}}, "htcondor"),
    ({"backend": "dask", "dask": {"adress": "tcp://a:1"}}, "adress"),
])
def test_impossible_dask_settings_are_rejected(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RunPolicy(**fields)


def test_jobqueue_defaults_to_one_worker_per_core() -> None:
    assert JobqueueSettings(cores=6).processes is None
    assert RunPolicy(backend="dask", dask={"jobqueue": {"cores": 6, "processes": 6}}).dask.jobqueue.processes == 6


def test_batches_grow_towards_the_target_and_leave_a_balanced_tail() -> None:
    sizer = BatchSizer(target_sec=0.05)
    assert sizer.next_size(1000, slots=2) == 1  # nothing known yet
    sizer.observe([0.001] * 10)
    assert sizer.next_size(1000, slots=2) == 50
    assert sizer.next_size(40, slots=2) == 10  # the tail is shared by every slot
    sizer.observe([2.0])
    assert sizer.next_size(1000, slots=2) == 1  # slow subjects travel alone
    assert sizer.next_size(0, slots=2) == 0



def test_job_ledger_cancels_what_a_killed_runner_left_and_only_that(tmp_path: Path) -> None:
    import shlex
    import sys

    from habitrun.engine.dask_backend.jobs import JobLedger

    called = tmp_path / "cancelled.txt"
    recorder = f"{shlex.quote(sys.executable)} -c \"import sys; open({str(called)!r}, 'a').write(' '.join(sys.argv[1:]))\""
    ledger = JobLedger(tmp_path / "dask-jobs" / "ledger.json", recorder)
    assert ledger.cancel_leftovers() == [] and not called.exists()  # nothing recorded: nothing run
    ledger.add("11")
    ledger.add("12")
    ledger.add("12")
    ledger.remove("11")  # cancelled by its runner: struck
    assert JobLedger(ledger.path, recorder).cancel_leftovers() == ["12"]  # the next runner of the study
    assert called.read_text() == "12"
    assert ledger.cancel_leftovers() == []
