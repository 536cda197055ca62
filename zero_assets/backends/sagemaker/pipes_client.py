"""`PipesSageMakerClient`: SageMaker Training and Processing jobs as Dagster Pipes invocations.

Shaped like dagster-aws's ECS and Glue clients, plus: reattaching by deterministic job name, `Stopped` as a
failure, failures carrying FailureReason and the last log lines, and transient AWS errors waited out.
"""

from __future__ import annotations

import time
from typing import Any, Literal, Optional

from botocore.exceptions import ClientError
from dagster import (
    DagsterExecutionInterruptedError,
    Failure,
    MetadataValue,
    PipesClient,
    PipesClientCompletedInvocation,
    open_pipes_session,
)
from dagster._core.definitions.resource_annotation import TreatAsResourceParam  # not exported by dagster
from dagster_aws.pipes import PipesCloudWatchMessageReader

from training_code.lib.aws_clients import Backoff, endpoint_of, is_retryable, retry_call
from zero_assets.backends.job_cost import job_cost, price_table
from zero_assets.backends.sagemaker.attempts import TERMINAL, BeforeLaunch, JobAttempts, ReportUnreadable
from zero_assets.backends.sagemaker.job_api import API, REATTACHABLE, Kind, failure_description, stop_job
from zero_assets.backends.sagemaker.job_logs import JobLogTail
from zero_assets.backends.sagemaker.job_params import check_environment
from zero_assets.backends.sagemaker.pipes_io import (
    JobKeyedS3ContextInjector,
    await_message_stream,
    await_report,
    message_reader_for,
    report_message_stream,
)
from zero_assets.backends.sagemaker.training_plan import PendingWait, TrainingPlan, plan_metadata


class PipesSageMakerClient(JobAttempts, PipesClient, TreatAsResourceParam):
    """A Pipes client for SageMaker Training and Processing jobs.

    `pipes_uri`: `s3://bucket/prefix` for contexts and messages, keyed by job name; `messages`: where the
    reader reads, "s3" (reattach-safe) or "cloudwatch"; the job's CloudWatch lines go to the step's stdout."""

    def __init__(
        self,
        client,
        logs_client,
        s3_client,
        pipes_uri: str,
        messages: Literal["s3", "cloudwatch"] = "s3",
        forward_termination: bool = True,
        poll_interval: float = 15.0,
        message_poll_interval: float = 10.0,
    ):
        self._client, self._logs, self._s3 = client, logs_client, s3_client
        self._pipes_uri = pipes_uri
        self._messages = messages
        self.forward_termination = forward_termination
        self.poll_interval = poll_interval
        self.message_poll_interval = message_poll_interval
        # Read before any job launches: a bad ZERO_SM_PRICE_TABLE fails here, not after the job.
        self._prices = price_table()

    @classmethod
    def _is_dagster_maintained(cls) -> bool:
        return False

    def describe(self, kind: Kind, job_name: str) -> Optional[dict[str, Any]]:
        """The job's description, or None when no job has that name."""
        api = API[kind]
        try:
            return getattr(self._client, api.describe)(**{api.name_key: job_name})
        except ClientError as error:
            message = error.response.get("Error", {}).get("Message", "").lower()
            if error.response.get("Error", {}).get("Code") == "ValidationException" and (
                "not found" in message or "could not find" in message
            ):
                return None
            raise

    def describe_patiently(self, kind: Kind, job_name: str) -> Optional[dict[str, Any]]:
        """`describe`, retried through throttling and outages for up to the AWS retry window."""
        return retry_call(
            lambda: self.describe(kind, job_name),
            what=f"Describe {kind} job {job_name}",
            endpoint=endpoint_of(self._client),
        )

    def job_status(self, kind: Kind, job: dict[str, Any]) -> str:
        return job[API[kind].status_key]

    def run(  # type: ignore[override]
        self,
        *,
        context,
        kind: Kind,
        params: dict[str, Any],
        before_launch: Optional[BeforeLaunch] = None,
        training_plan: Optional[TrainingPlan] = None,
    ) -> PipesClientCompletedInvocation:
        """Launch the job `params` describe, or reattach to it, and wait; `before_launch` may refuse a launch."""
        api = API[kind]
        name = params[api.name_key]
        existing = self.describe_patiently(kind, name)
        if existing is not None and existing[api.status_key] not in REATTACHABLE:
            raise Failure(
                f"SageMaker {kind} job {name} already ended {existing[api.status_key]}; "
                "use resolve_job_name for a fresh attempt"
            )
        if existing is None and before_launch is not None:
            before_launch(params)
        injector, reader = self._pipes_io(name)
        logs = JobLogTail(self._logs, api.log_group, name)
        with open_pipes_session(context=context, message_reader=reader, context_injector=injector) as session:
            if existing is None:
                environment = {**params.get("Environment", {}), **session.get_bootstrap_env_vars()}
                check_environment(environment, kind)
                tags = [
                    *params.get("Tags", []),
                    *({"Key": k, "Value": v[:256]} for k, v in session.default_remote_invocation_info.items()),
                ]
                self._create(context, kind, {**params, "Environment": environment, "Tags": tags})
            else:
                context.log.info(
                    f"[pipes] reattached to SageMaker {kind} job {name} ({existing[api.status_key]}), "
                    "launched by an earlier run"
                )
            try:
                job, history = self._wait_for_completion(
                    context, kind, name, logs, session, reader, PendingWait(name, training_plan)
                )
            except DagsterExecutionInterruptedError:
                if self.forward_termination:
                    context.log.warning(f"[pipes] Dagster run interrupted: stopping SageMaker {kind} job {name}")
                    self._terminate(context, kind, name)
                raise
            if job[api.status_key] != "Completed":
                # A stopped job, or one out of time, would end the same way again: no retry.
                raise Failure(
                    description=failure_description(kind, job, logs.last_lines),
                    metadata=self._extract_dagster_metadata(kind, job, history, training_plan),
                    allow_retries=job[api.status_key] != "Stopped",
                )
            await_report(context.log, session, reader, name, self.message_poll_interval)
        handler = session.message_handler
        if existing is not None and not handler.received_closed_message:
            missing = "no closing message" if handler.received_opened_message else "no message at all"
            raise ReportUnreadable(
                f"SageMaker {kind} job {name} ended Completed, but its Pipes report could not be read ({missing}): "
                "its messages expired or were deleted; the attempt counts as failed"
            )
        metadata = self._extract_dagster_metadata(kind, job, history, training_plan)
        return PipesClientCompletedInvocation(session, metadata=metadata)

    def _create(self, context, kind: Kind, params: dict[str, Any]) -> None:
        """Create*Job, retried; a retry that finds the name taken by its own earlier try succeeds."""
        api = API[kind]
        name = params[api.name_key]
        tries = 0

        def create() -> None:
            nonlocal tries
            tries += 1
            try:
                getattr(self._client, api.create)(**params)
            except ClientError as error:
                # A try whose answer was lost may have created the job.
                if tries > 1 and error.response.get("Error", {}).get("Code") == "ResourceInUse":
                    return
                raise

        retry_call(create, what=f"{api.create} {name}", endpoint=endpoint_of(self._client))
        context.log.info(f"[pipes] launched SageMaker {kind} job {name}")

    def _pipes_io(self, job_name: str):
        injector = JobKeyedS3ContextInjector(pipes_uri=self._pipes_uri, job_name=job_name, client=self._s3)
        reader = message_reader_for(
            self._messages,
            pipes_uri=self._pipes_uri,
            job_name=job_name,
            s3_client=self._s3,
            logs_client=self._logs,
            interval=self.message_poll_interval,
        )
        return injector, reader

    def _wait_for_completion(
        self, context, kind: Kind, name: str, logs: JobLogTail, session, reader, pending: PendingWait
    ) -> tuple[dict, list[str]]:
        status_key, log_group = API[kind].status_key, API[kind].log_group
        history: list[str] = []
        reads_cloudwatch = isinstance(reader, PipesCloudWatchMessageReader)
        reported_stream = False
        refused = Backoff(first_s=self.poll_interval, max_s=max(60.0, self.poll_interval))
        while True:
            try:
                job = self.describe(kind, name)
            except Exception as error:  # noqa: BLE001 - only transient errors are waited out
                if not is_retryable(error):
                    raise
                delay = refused.failed()
                context.log.warning(
                    f"[pipes] describing {name} failed ({error}); the job keeps running, asking again in {delay:.0f}s"
                )
                time.sleep(delay)
                continue
            refused.succeeded()
            status = "/".join(filter(None, [job[status_key], job.get("SecondaryStatus")]))
            if not history or history[-1] != status:
                history.append(status)
                context.log.info(f"[pipes] {name}: {status}")
            pending.seen(context.log, job.get("SecondaryStatus") if kind == "training" else None)
            logs.forward(context.log, logs.poll())
            if reads_cloudwatch and not reported_stream:
                reported_stream = report_message_stream(logs, session, log_group)
            if job[status_key] in TERMINAL:
                logs.forward(context.log, logs.final_poll())
                if reads_cloudwatch and not reported_stream:
                    await_message_stream(logs, session, log_group, within_s=120)
                if logs.throttled:
                    context.log.info(
                        f"[pipes] CloudWatch Logs refused {logs.throttled} reads of {name}'s logs; "
                        "each was backed off and read again"
                    )
                return job, history
            time.sleep(self.poll_interval)

    def _terminate(self, context, kind: Kind, name: str) -> None:
        refused = stop_job(self._client, kind, name)
        if refused is not None:
            context.log.warning(f"[pipes] could not stop SageMaker {kind} job {name}: {refused}")

    def _extract_dagster_metadata(
        self, kind: Kind, job: dict, history: list[str], plan: Optional[TrainingPlan] = None
    ) -> dict[str, Any]:
        name = job[API[kind].name_key]
        region = self._client.meta.region_name
        section = "jobs" if kind == "training" else "processing-jobs"
        transitions = [t["Status"] for t in job.get("SecondaryStatusTransitions", [])] if kind == "training" else []
        return {
            "job_name": name,
            "job_status": job[API[kind].status_key],
            "console_url": MetadataValue.url(
                f"https://{region}.console.aws.amazon.com/sagemaker/home?region={region}#/{section}/{name}"
            ),
            "logs_url": MetadataValue.url(
                f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}#logsV2:log-groups/log-group/"
                f"{API[kind].log_group.replace('/', '$252F')}$3FlogStreamNameFilter$3D{name}"
            ),
            **job_cost(kind, job, region, self._prices, plan.fee() if plan else None),
            **(plan_metadata(plan) if plan else {}),
            "status_history": MetadataValue.json(transitions or history),
        }
