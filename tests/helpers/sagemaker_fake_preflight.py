"""What the preflight asks AWS that moto does not answer, validated by botocore like the SageMaker fake.

moto (5.x) has no `iam:SimulatePrincipalPolicy` and no FSx data repository associations: `FakeIam` simulates a
role whose policies are a table of allowed and denied (resource pattern, action pattern) pairs, and `FakeFsx`
lists the associations it was given. Both check each request and answer against botocore's model of the
operation, so what the preflight sends and reads is what AWS takes and gives. `wandb_server` is a W&B
GraphQL endpoint on loopback that knows one API key, as `wandb login` meets the real one.
"""

from __future__ import annotations

import base64
import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from types import SimpleNamespace

import botocore.session
from botocore.exceptions import ClientError
from botocore.validate import validate_parameters

from helpers.loopback_http import QuietHandler, loopback_server

_SESSION = botocore.session.get_session()


def _validated(service: str, operation: str, request: dict, response: dict) -> dict:
    model = _SESSION.get_service_model(service).operation_model(operation)
    validate_parameters(request, model.input_shape)
    validate_parameters(response, model.output_shape)
    return response


@dataclass
class FakeIam:
    """A role's policies as (resource pattern, action pattern) pairs; a deny wins over an allow."""

    allowed: list[tuple[str, str]] = field(default_factory=lambda: [("*", "*")])
    denied: list[tuple[str, str]] = field(default_factory=list)
    caller_may_simulate: bool = True
    roles: tuple[str, ...] = ("arn:aws:iam::123456789012:role/zero-jobs",)
    calls: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.meta = SimpleNamespace(region_name="us-east-1")

    def simulate_principal_policy(self, **request):
        self.calls.append(request)
        if not self.caller_may_simulate:
            raise ClientError(
                {
                    "Error": {
                        "Code": "AccessDenied",
                        "Message": "User: arn:aws:sts::123456789012:assumed-role/dagster/run is not authorized to "
                        f"perform: iam:SimulatePrincipalPolicy on resource: {request['PolicySourceArn']}",
                    }
                },
                "SimulatePrincipalPolicy",
            )
        if request["PolicySourceArn"] not in self.roles:
            raise ClientError(
                {
                    "Error": {
                        "Code": "NoSuchEntity",
                        "Message": f"The role {request['PolicySourceArn']} cannot be found",
                    }
                },
                "SimulatePrincipalPolicy",
            )
        results = [
            {
                "EvalActionName": action,
                "EvalResourceName": resource,
                "EvalDecision": self._decision(action, resource),
                "MatchedStatements": [],
                "MissingContextValues": [],
            }
            for action in request["ActionNames"]
            for resource in request.get("ResourceArns", ["*"])
        ]
        return _validated(
            "iam", "SimulatePrincipalPolicy", request, {"EvaluationResults": results, "IsTruncated": False}
        )

    def _decision(self, action: str, resource: str) -> str:
        def matches(pairs):
            return any(fnmatchcase(resource, r) and fnmatchcase(action, a) for r, a in pairs)

        if matches(self.denied):
            return "explicitDeny"
        return "allowed" if matches(self.allowed) else "implicitDeny"


@dataclass
class FakeFsx:
    """The data repository associations of file systems, as DescribeDataRepositoryAssociations lists them."""

    associations: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.meta = SimpleNamespace(region_name="us-east-1")

    def add_association(
        self, file_system_id: str, path: str, repository: str, lifecycle: str = "AVAILABLE", failure: str = ""
    ) -> str:
        number = len(self.associations) + 1
        association = {
            "AssociationId": f"dra-{number:017d}",
            "ResourceARN": f"arn:aws:fsx:us-east-1:123456789012:association/{file_system_id}/dra-{number:017d}",
            "FileSystemId": file_system_id,
            "Lifecycle": lifecycle,
            "FileSystemPath": path,
            "DataRepositoryPath": repository,
            "BatchImportMetaDataOnCreate": True,
            "CreationTime": datetime.now(UTC),
        }
        if failure:
            association["FailureDetails"] = {"Message": failure}
        self.associations.append(association)
        return association["AssociationId"]

    def describe_data_repository_associations(self, **request):
        systems = {v for f in request.get("Filters", []) if f["Name"] == "file-system-id" for v in f["Values"]}
        found = [a for a in self.associations if not systems or a["FileSystemId"] in systems]
        return _validated("fsx", "DescribeDataRepositoryAssociations", request, {"Associations": found})


@contextmanager
def wandb_server(good_key: str, username: str = "rehearsal-bot"):
    """A W&B GraphQL endpoint on loopback: the viewer query with `good_key` answers the user, any other key
    HTTP 401 as W&B's does. Yields its base URL; `.logins` counts the queries."""
    logins: list[str] = []

    class Handler(QuietHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server hook's name
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            logins.append(body.get("query", ""))
            auth = self.headers.get("Authorization", "")
            key = base64.b64decode(auth.split(" ", 1)[1]).decode().split(":", 1)[1] if " " in auth else ""
            if self.path != "/graphql" or key != good_key:
                self.reply(401, b'{"errors": [{"message": "user is not logged in"}]}')
                return
            answer = {"data": {"viewer": {"id": "VXNlcjox", "username": username, "entity": username}}}
            self.reply(200, json.dumps(answer).encode(), "application/json")

    with loopback_server(Handler) as url:
        yield SimpleNamespace(url=url, logins=logins)
