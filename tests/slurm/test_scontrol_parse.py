"""``scontrol -o show node`` lines and ``squeue -O`` records -> NodeInfo / JobInfo.

The 22.05 lines were captured from the testbed (Debian 12, Slurm 22.05.8). The
24.11-style lines were written from Slurm's ``slurm_sprint_node_table`` /
``slurm_sprint_job_info``: more fields, a different order, fields this parser
has never heard of.
"""

from __future__ import annotations

import json

import pytest

from slurm_hooks.errors import PermanentError
from slurm_hooks.models import Action
from slurm_hooks.slurm import may_drain, may_resume, parse_reason
from slurm_hooks.slurm.scontrol import (
    SlurmCommandFailed,
    parse_fields,
    parse_node_json,
    parse_node_line,
    parse_squeue_job,
    parse_squeue_jobs,
)

SLINKY_COMMENT = '{"namespace":"slurm","podName":"slurm-worker-gpu-0","node":"k8s-node-1"}'

# --- captured from Slurm 22.05.8 ---------------------------------------------------

NODE_IDLE_2205 = (
    "NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=8 CPUTot=8 CPULoad=0.17 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:8 NodeAddr=localhost NodeHostName=localhost "
    "Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=8000 AllocMem=0 FreeMem=23523 "
    "Sockets=8 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu  "
    "BootTime=2026-11-29T21:08:34 SlurmdStartTime=2026-11-29T21:21:54 LastBusyTime=2026-11-29T21:21:54 "
    "CfgTRES=cpu=8,mem=8000M,billing=8 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s "
    "ExtSensorsWatts=0 ExtSensorsTemp=n/s"
)

NODE_ADMIN_DRAIN_WITH_SLINKY_COMMENT_2205 = (
    "NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=8 CPUTot=8 CPULoad=0.35 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:8 NodeAddr=localhost NodeHostName=localhost "
    "Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=8000 AllocMem=0 FreeMem=23531 "
    "Sockets=8 Boards=1 State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
    "Partitions=gpu  BootTime=2026-11-29T21:08:34 SlurmdStartTime=2026-11-29T21:26:48 "
    "LastBusyTime=2026-11-29T21:26:48 CfgTRES=cpu=8,mem=8000M,billing=8 AllocTRES= CapWatts=n/a CurrentWatts=0 "
    "AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s "
    "Reason=hw check by bob [root@2026-11-29T21:27:07] "
    "Comment=" + SLINKY_COMMENT
)

NODE_OUR_DRAIN_2205 = (
    "NodeName=n2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=8 CPUTot=8 CPULoad=0.35 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:8 NodeAddr=localhost NodeHostName=localhost "
    "Port=30902 Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=8000 AllocMem=0 "
    "FreeMem=23531 Sockets=8 Boards=1 State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A "
    "MCS_label=N/A Partitions=gpu  BootTime=2026-11-29T21:08:34 SlurmdStartTime=2026-11-29T21:26:48 "
    "LastBusyTime=2026-11-29T21:26:48 CfgTRES=cpu=8,mem=8000M,billing=8 AllocTRES= CapWatts=n/a CurrentWatts=0 "
    "AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s "
    "Reason=slurm-hooks: XID 79 on GPU 3 (gpu=3 lost) [replace] [root@2026-11-29T21:27:07]"
)

NODE_DOWN_NOT_RESPONDING_2205 = (
    "NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=8 CPUTot=8 CPULoad=0.35 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:8 NodeAddr=localhost NodeHostName=localhost "
    "Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=8000 AllocMem=0 FreeMem=23531 "
    "Sockets=8 Boards=1 State=DOWN+NOT_RESPONDING ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
    "Partitions=gpu  BootTime=None SlurmdStartTime=2026-11-29T21:26:48 LastBusyTime=2026-11-29T21:27:07 "
    "CfgTRES=cpu=8,mem=8000M,billing=8 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s "
    "ExtSensorsWatts=0 ExtSensorsTemp=n/s Reason=Not responding [root@2026-11-29T21:27:07] "
    "Comment=" + SLINKY_COMMENT
)

# --- newer Slurm (24.11 field set and order), written from its source --------------------

NODE_2411_DRAINED_BY_US = (
    "NodeName=slurm-worker-gpu-0 Arch=x86_64 CpuBind=cores CoresPerSocket=48 CPUAlloc=0 CPUEfctv=96 CPUTot=96 "
    "CPULoad=0.54 AvailableFeatures=h100,nvlink ActiveFeatures=h100,nvlink Gres=gpu:h100:8(S:0-1) "
    "GresDrain=N/A GresUsed=gpu:h100:0(IDX:N/A) NodeAddr=10.0.0.12 NodeHostName=slurm-worker-gpu-0 "
    "Version=24.11.1 OS=Linux 6.8.0-45-generic #45-Ubuntu SMP PREEMPT_DYNAMIC Fri Aug 30 12:02:04 UTC 2024  "
    "RealMemory=2000000 AllocMem=0 FreeMem=1900000 Sockets=2 Boards=1 RestrictedCoresPerGPU=2(0-15) "
    "State=IDLE+DRAIN+DYNAMIC_NORM ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
    "Partitions=gpu,all  BootTime=2024-09-01T10:00:00 SlurmdStartTime=2024-09-01T10:01:00 "
    "LastBusyTime=2024-09-01T10:05:00 ResumeAfterTime=None CfgTRES=cpu=96,mem=2000000M,billing=96,gres/gpu=8 "
    "AllocTRES= CurrentWatts=0 AveWatts=0 "
    "Reason=slurm-hooks: XID 79 on GPU 3 [replace] [slurm@2024-09-01T10:06:00] "
    "Comment=" + SLINKY_COMMENT + " Extra={\"rack\":\"r12\",\"slot\":\"u3\"} "
    "InstanceId=i-0abc123 InstanceType=p5.48xlarge"
)

NODE_2411_OPERATOR_DRAIN_WITH_FUTURE_FIELD = (
    "NodeName=slurm-worker-gpu-1 Arch=x86_64 CoresPerSocket=48 CPUAlloc=96 CPUEfctv=96 CPUTot=96 CPULoad=95.00 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:8 NodeAddr=10.0.0.13 "
    "NodeHostName=slurm-worker-gpu-1 Version=25.11.0 OS=Linux 6.8.0 #1 SMP  RealMemory=1 AllocMem=0 FreeMem=N/A "
    "Sockets=2 Boards=1 State=MIXED+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
    "TopologyQuality=good SomeFutureFlag=on "
    "Partitions=gpu  BootTime=None SlurmdStartTime=None LastBusyTime=2025-12-01T00:00:00 ResumeAfterTime=None "
    "CfgTRES=cpu=96,mem=1M,billing=96 AllocTRES=cpu=96 CurrentWatts=n/a AveWatts=n/a "
    "Reason=slurm-operator: Node is cordoned (k8s node k8s-node-2) [slurm@2025-12-01T00:00:01]"
)

# --- nodes ---------------------------------------------------------------------------------


def test_idle_node_from_2205_has_state_gres_and_no_reason():
    node = parse_node_line(NODE_IDLE_2205)
    assert (node.name, node.state, node.gres, node.reason, node.comment) == ("n1", "IDLE", "gpu:8", "", "")
    assert not node.drained
    assert node.extra["OS"] == "Linux 6.18.44-fc-v669 #1 SMP PREEMPT_DYNAMIC @0"
    assert node.extra["CfgTRES"] == "cpu=8,mem=8000M,billing=8"
    assert node.extra["AllocTRES"] == ""


def test_admin_reason_with_spaces_drops_user_and_time_and_keeps_the_slinky_comment():
    node = parse_node_line(NODE_ADMIN_DRAIN_WITH_SLINKY_COMMENT_2205)
    assert node.reason == "hw check by bob"
    assert node.extra["ReasonUser"] == "root"
    assert node.extra["ReasonTime"] == "2026-11-29T21:27:07"
    assert json.loads(node.comment) == {"namespace": "slurm", "podName": "slurm-worker-gpu-0", "node": "k8s-node-1"}
    assert node.drained and not node.ours
    assert not may_drain(node) and not may_resume(node)


def test_our_reason_keeps_its_action_tag_and_equals_signs():
    node = parse_node_line(NODE_OUR_DRAIN_2205)
    assert node.reason == "slurm-hooks: XID 79 on GPU 3 (gpu=3 lost) [replace]"
    assert node.ours and may_resume(node) and may_drain(node)
    assert parse_reason(node.reason) == ("XID 79 on GPU 3 (gpu=3 lost)", Action.REPLACE)
    assert node.extra["Port"] == "30902"


def test_down_not_responding_node_is_not_drained_and_keeps_slurms_reason():
    node = parse_node_line(NODE_DOWN_NOT_RESPONDING_2205)
    assert node.base_state == "DOWN"
    assert "NOT_RESPONDING" in node.flags
    assert node.reason == "Not responding"
    assert not node.drained
    assert node.comment == SLINKY_COMMENT


def test_node_line_from_2411_with_extra_fields_and_gres_types():
    node = parse_node_line(NODE_2411_DRAINED_BY_US)
    assert node.name == "slurm-worker-gpu-0"
    assert node.state == "IDLE+DRAIN+DYNAMIC_NORM"
    assert node.base_state == "IDLE" and node.drained
    assert node.gres == "gpu:h100:8(S:0-1)"
    assert node.reason == "slurm-hooks: XID 79 on GPU 3 [replace]"
    assert node.extra["ReasonUser"] == "slurm"
    assert node.comment == SLINKY_COMMENT
    assert json.loads(node.extra["Extra"]) == {"rack": "r12", "slot": "u3"}
    assert node.extra["InstanceType"] == "p5.48xlarge"
    assert node.extra["OS"] == "Linux 6.8.0-45-generic #45-Ubuntu SMP PREEMPT_DYNAMIC Fri Aug 30 12:02:04 UTC 2024"
    assert node.extra["RestrictedCoresPerGPU"] == "2(0-15)"


def test_unknown_fields_of_a_future_slurm_land_in_extra_and_operator_reason_is_not_ours():
    node = parse_node_line(NODE_2411_OPERATOR_DRAIN_WITH_FUTURE_FIELD)
    assert node.extra["SomeFutureFlag"] == "on"
    assert node.extra["TopologyQuality"] == "good"
    assert node.reason == "slurm-operator: Node is cordoned (k8s node k8s-node-2)"
    assert node.drained and not node.ours
    assert not may_drain(node) and not may_resume(node)


def test_reason_without_user_and_time_ends_at_the_next_known_key():
    line = NODE_IDLE_2205.replace("State=IDLE", "State=IDLE+DRAIN") + " Reason=Prolog error Comment=x y"
    node = parse_node_line(line)
    assert node.reason == "Prolog error"
    assert node.comment == "x y"


def test_reason_containing_key_like_words_is_kept_whole_when_bracketed():
    line = NODE_IDLE_2205 + " Reason=bad State=broken Comment=seen Gres=gone [bob@2025-01-01T00:00:00]"
    node = parse_node_line(line)
    assert node.reason == "bad State=broken Comment=seen Gres=gone"
    assert node.state == "IDLE"
    assert node.comment == ""
    assert node.gres == "gpu:8"


def test_node_line_missing_name_or_state_is_a_permanent_error():
    with pytest.raises(SlurmCommandFailed) as err:
        parse_node_line("Node nX not found")
    assert isinstance(err.value, PermanentError)


def test_generic_split_does_not_take_tres_items_for_keys():
    fields = parse_fields("A=1 CfgTRES=cpu=8,mem=1M,gres/gpu=8 B=", frozenset({"A", "CfgTRES", "B"}), frozenset())
    assert fields == {"A": "1", "CfgTRES": "cpu=8,mem=1M,gres/gpu=8", "B": ""}


# --- keys newer Slurm prints after Reason= ----------------------------------------------------

#: 25.05 prints TLSCertTokenSet/TLSCertLastRenewal after the reason, 25.11 Parameters.
NODE_2505_TLS_AFTER_REASON = (
    "NodeName=gpu-1 Arch=x86_64 CoresPerSocket=32 CPUAlloc=0 CPUEfctv=64 CPUTot=64 Gres=gpu:h100:8 "
    "State=IDLE+DRAIN ThreadsPerCore=1 Partitions=gpu CfgTRES=cpu=64,mem=500G,billing=64,gres/gpu=8 "
    "Reason=slurm-hooks: XID 79 on GPU 3 [replace] [root@2025-06-01T10:00:00] "
    "Comment=(null) TLSCertTokenSet=No TLSCertLastRenewal=None"
)
NODE_2511_PARAMETERS_AFTER_BARE_REASON = (
    "NodeName=gpu-2 State=IDLE+DRAIN Partitions=gpu Reason=hw check by bob Parameters=foo=bar TLSCertTokenSet=Yes"
)
NODE_FUTURE_KEY_AFTER_BRACKETED_REASON = (
    "NodeName=gpu-3 State=DOWN+DRAIN Reason=Not responding [slurm@2026-01-01T00:00:00] SomeFutureKey=1 Other=x y"
)


def test_tls_keys_from_2505_after_the_reason_are_not_swallowed_into_it():
    node = parse_node_line(NODE_2505_TLS_AFTER_REASON)
    assert node.reason == "slurm-hooks: XID 79 on GPU 3 [replace]"
    assert node.ours and may_resume(node)
    assert (node.extra["TLSCertTokenSet"], node.extra["TLSCertLastRenewal"]) == ("No", "None")


def test_parameters_from_2511_after_a_reason_without_user_and_time_ends_it():
    node = parse_node_line(NODE_2511_PARAMETERS_AFTER_BARE_REASON)
    assert node.reason == "hw check by bob"
    assert node.extra["Parameters"] == "foo=bar" and node.extra["TLSCertTokenSet"] == "Yes"


def test_any_key_after_the_user_and_time_bracket_ends_the_reason():
    node = parse_node_line(NODE_FUTURE_KEY_AFTER_BRACKETED_REASON)
    assert node.reason == "Not responding"
    assert node.extra["ReasonUser"] == "slurm"


# --- squeue -O records -------------------------------------------------------------------------


def _squeue(*records: tuple) -> str:
    """Lines as ``squeue -h -O SQUEUE_JOB_FORMAT`` prints them (captured shape, 22.05.8)."""
    return "".join("|".join(str(f) for f in r) + "\n" for r in records)


def test_array_tasks_keep_their_unique_id_and_are_addressed_as_array_underscore_task():
    # Captured on the testbed: `sbatch -a 0-3`; the last task to start carries the array's id (1).
    out = ("2|1|0|N/A|RUNNING|n1|1|0|1|4294901757|None|root|wrap|2\n"
           "1|1|3|N/A|RUNNING|n2|1|0|1|4294901757|None|root|wrap|1\n")
    jobs = parse_squeue_jobs(out)
    assert [(j.job_id, j.ref) for j in jobs] == [(2, "1_0"), (1, "1_3")]
    assert jobs[1].answers_to(1) and jobs[1].answers_to("1_3") and not jobs[0].answers_to(1)


def test_a_plain_job_and_a_het_component_are_addressed_by_id_and_by_their_leader():
    out = "10|10|N/A|N/A|RUNNING|n1|1|0|1|5|None|root|plain|10\n8|8|N/A|7|RUNNING|n2|1|0|1|5|None|root|het|8\n"
    plain, component = parse_squeue_jobs(out)
    assert (plain.ref, component.ref, component.het_job_id) == ("10", "7", 7)


def test_squeue_job_states_and_holds_are_typed():
    held = parse_squeue_job("9|9|N/A|N/A|PENDING||1|1|1|0|launch failed requeued held|root|x|9")
    assert held.pending and held.held_by_launch_failure and held.priority == "0"
    assert not held.held_by_admin and not held.active
    admin = parse_squeue_job("9|9|N/A|N/A|PENDING||1|1|1|0|JobHeldAdmin|root|x|9")
    assert admin.held_by_admin and not admin.held_by_launch_failure
    completing = parse_squeue_job("9|9|N/A|N/A|COMPLETING|n1|1|0|1|5|None|root|x|9")
    assert completing.active and completing.completing and not completing.finished
    assert parse_squeue_job("9|9|N/A|N/A|COMPLETED|n1|1|0|1|5|None|root|x|9").finished


def test_a_job_name_with_a_newline_cannot_pass_for_another_jobs_record():
    # Captured: `sbatch -J $'nl\nfake'` prints its name across two lines. Here the name forges a
    # whole record for job 102 (COMPLETED elsewhere): the forgery must not be believed.
    forged = "102|102|N/A|N/A|COMPLETED|elsewhere|0|0|1|1|None|root|y"
    out = _squeue((101, 101, "N/A", "N/A", "RUNNING", "n1", 1, 0, 1, 5, "None", "root", f"x|101\n{forged}", 101),
                  (102, 102, "N/A", "N/A", "RUNNING", "n1", 1, 0, 1, 5, "None", "root", "victim", 102))
    assert parse_squeue_jobs(out) is None  # so the caller asks again without names
    without_names = "101|101|N/A|N/A|RUNNING|n1|1|0|1|5|None|root|101\n102|102|N/A|N/A|RUNNING|n1|1|0|1|5|None|root|102\n"
    jobs = parse_squeue_jobs(without_names, named=False)
    assert [(j.job_id, j.state, j.nodes, j.name) for j in jobs] == [(101, "RUNNING", "n1", ""), (102, "RUNNING", "n1", "")]


def test_a_name_with_pipes_stays_the_name():
    [job] = parse_squeue_jobs("5|5|N/A|N/A|RUNNING|n1|1|0|1|5|None|root|a|b|COMPLETED|5\n")
    assert (job.name, job.state) == ("a|b|COMPLETED", "RUNNING")


# --- scontrol --json (23.02+; not run live here: the testbed is 22.05) -----------------------------

#: The node of the example in Slurm's slurmrestd(8) man page (24.11, "host1"), with a drain
#: added; trimmed to the fields this parser reads plus a few it must ignore.
NODE_JSON_2411 = """{"nodes": [{"architecture": "x86_64", "gres": "gpu:fake1:1(S:0),gpu:fake2:1(S:0)",
 "name": "host1", "address": "localhost", "hostname": "omicronpersei8", "state": ["IDLE", "DRAIN"],
 "comment": "", "reason": "slurm-hooks: XID 79 on GPU 3 [replace]",
 "reason_changed_at": {"set": true, "infinite": false, "number": 1722010000},
 "reason_set_by_user": "root", "tres": "cpu=32,mem=127927M,billing=32,gres/gpu=2", "version": "24.11.0-0rc1"}],
 "last_update": {"set": true, "infinite": false, "number": 1722010273}, "errors": [], "warnings": []}"""
#: The shape of the rest_quickstart example for 23.02 ("kitt"): state as a list, times as numbers.
NODE_JSON_2302 = """{"nodes": [{"name": "kitt", "state": ["IDLE"], "reason": "", "reason_changed_at": 0,
 "reason_set_by_user": "", "comment": "", "gres": "", "version": "23.02.3"}]}"""
#: The older data parsers (v0.0.38 and before): a lower-case state string plus state_flags.
NODE_JSON_OLD = """{"nodes": [{"name": "thisisaname", "state": "down", "state_flags": ["NOT_RESPONDING", "DRAIN"],
 "reason": "Not responding", "reason_changed_at": 1667084449, "reason_set_by_user": "slurm"}]}"""


def test_json_node_from_2411_is_drained_by_us():
    [node] = parse_node_json(NODE_JSON_2411)
    assert (node.name, node.state, node.reason) == ("host1", "IDLE+DRAIN", "slurm-hooks: XID 79 on GPU 3 [replace]")
    assert node.drained and node.ours and node.extra["ReasonUser"] == "root"
    assert node.extra["ReasonTime"] == "1722010000"


def test_json_node_shapes_of_2302_and_older_parsers():
    [idle] = parse_node_json(NODE_JSON_2302)
    assert (idle.state, idle.reason, idle.drained) == ("IDLE", "", False)
    [down] = parse_node_json(NODE_JSON_OLD)
    assert down.state == "DOWN+NOT_RESPONDING+DRAIN" and down.base_state == "DOWN" and down.drained
    assert not down.ours and down.reason == "Not responding"


def test_json_node_partitions_read_as_the_text_form_writes_them():
    # The sweep asks for the node's own partitions (`Partitions=gpu,debug` in `scontrol -o show node`).
    raw = json.loads(NODE_JSON_2302)
    raw["nodes"][0]["partitions"] = ["gpu", "debug"]
    [node] = parse_node_json(json.dumps(raw))
    assert node.extra["Partitions"] == "gpu,debug"
    assert parse_node_json(NODE_JSON_2302)[0].extra["Partitions"] == ""


@pytest.mark.parametrize("text", ["", "{", '{"nodes": {}}', '{"nodes": [{"state": ["IDLE"]}]}', "[]"])
def test_json_that_is_not_a_node_list_is_a_permanent_error(text):
    with pytest.raises(SlurmCommandFailed):
        parse_node_json(text)


def test_a_job_name_cannot_spoof_the_job_state_or_node_list():
    # Fixed by reading jobs from squeue fields Slurm writes itself, the user's name last.
    from slurm_hooks.slurm.scontrol import parse_squeue_job

    name = "x UserId=nobody(65534) JobState=COMPLETED NodeList=elsewhere Requeue=0|COMPLETED|elsewhere|0"
    job = parse_squeue_job(f"77|77|N/A|N/A|RUNNING|n1|1|0|1|4294901759|None|root|{name}|77")
    assert (job.state, job.nodes, job.requeue) == ("RUNNING", "n1", True)
    assert job.name == name


#: ``scontrol show job`` as 25.11 prints it: SubmitLine on its own line (no slurmdbd needed).
SHOW_JOB_25_11 = "\n".join([
    "JobId=12 JobName=train",
    "   UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A",
    "   AdminComment=site: budget 42 ",
    "   SubmitLine=sbatch --gres=gpu:1 --signal=B:USR1@90 train.sh --signal=TERM ",
    "   WorkDir=/home/alice",
    "",
])


def test_the_submit_line_is_read_from_scontrol_show_job_on_25_11():
    from slurm_hooks.slurm.jobsignal import from_submit_line
    from slurm_hooks.slurm.scontrol import parse_admin_comment, parse_submit_line

    line = parse_submit_line(SHOW_JOB_25_11)
    assert line == "sbatch --gres=gpu:1 --signal=B:USR1@90 train.sh --signal=TERM"
    assert from_submit_line(line).spec == "B:USR1@90"
    assert parse_admin_comment(SHOW_JOB_25_11) == "site: budget 42"
    assert parse_submit_line(SHOW_JOB_25_11.replace("   SubmitLine=", "   Other=")) == ""


def test_a_jobs_owner_is_read_from_squeue():
    job = parse_squeue_job("4242|4242|N/A|N/A|RUNNING|n1|1|0|1|5|None|alice|train|4242")
    assert (job.job_id, job.user, job.name) == (4242, "alice", "train")
