"""The JobRunner interface is an ABC: a backend that leaves out a method fails when it is built, not
when an asset first calls it, and both backends implement all of it."""

import pytest

from zero_assets.backends.job_runner import JobRunner
from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.backends.sagemaker.runner import SageMakerJobRunner


def test_a_runner_missing_a_method_cannot_be_built():
    class HalfRunner(JobRunner):
        def run(self, context, request):
            raise AssertionError("never called")

    assert JobRunner.__abstractmethods__ == {
        "run",
        "instance_count",
        "read_list_uri",
        "warm_location",
        "warm_shards",
        "tune",
    }
    with pytest.raises(TypeError, match="abstract"):
        JobRunner()
    with pytest.raises(TypeError, match="warm_location"):
        HalfRunner()


@pytest.mark.parametrize("runner", [LocalJobRunner, SageMakerJobRunner])
def test_both_backends_implement_the_whole_interface(runner):
    assert runner.__abstractmethods__ == frozenset()
