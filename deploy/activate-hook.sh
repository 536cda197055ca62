# >>> zero_assets >>>
# Appended to .venv/bin/activate by `make venv` (from deploy/activate-hook.sh): every Dagster command
# run from the repo root in this shell talks to the instance `make demo` uses. The code location is
# not exported: `dagster dev`, `dagster-webserver` and `dagster-daemon` read [tool.dagster] in
# pyproject.toml, and `dagster asset materialize` takes `-m zero_assets.definitions`.
_zero_repo="$(cd "$(dirname "${BASH_SOURCE[0]:-$VIRTUAL_ENV/bin/activate}")/../.." && pwd)"
if [ -z "${DAGSTER_HOME:-}" ]; then
    export DAGSTER_HOME="$_zero_repo/.dagster_home"
    if [ ! -e "$DAGSTER_HOME/dagster.yaml" ]; then
        mkdir -p "$DAGSTER_HOME" && cp "$_zero_repo/dagster.yaml" "$DAGSTER_HOME/dagster.yaml"
    fi
elif [ ! -d "$DAGSTER_HOME" ]; then
    mkdir -p "$DAGSTER_HOME"  # Dagster refuses a DAGSTER_HOME that is not a folder
fi
# Dagster hides this one: with a code location in the environment as well as in pyproject.toml, the
# webserver `dagster dev` starts exits at once and `dagster dev` keeps running with no port open.
for _zero_var in DAGSTER_MODULE_NAME DAGSTER_PYTHON_FILE DAGSTER_PACKAGE_NAME DAGSTER_WORKING_DIRECTORY; do
    if [ -n "$(eval "printf %s \"\${$_zero_var:-}\"")" ]; then
        echo "zero_assets: $_zero_var is set in this shell; \`dagster dev\` will not serve the UI with it." \
            "Run \`unset $_zero_var\` (the code location comes from pyproject.toml)." >&2
    fi
done
unset _zero_repo _zero_var
# <<< zero_assets <<<
