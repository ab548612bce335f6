# The grader's container: the boundary for hostile code when grading a class.
#
#   docker build -t minisgl-grader .
#   docker run --rm --network none -v "$PWD/class:/class:ro" -v "$PWD/grades:/grades" \
#       minisgl-grader grade ch01 /class --out /grades
#
# Inside it `judge.py grade` still applies its limits to each submission; its namespaces need
# `--cap-add SYS_ADMIN --security-opt seccomp=unconfined` (without them it says so in the report
# and relies on the container alone). tools/grader_image.sh builds it and grades a sample class.
FROM python:3.11-slim

# util-linux: unshare and setpriv, the sandbox's namespaces and dropped capabilities
RUN apt-get update \
    && apt-get install -y --no-install-recommends util-linux \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /workbook
COPY pyproject.toml README.md ./
COPY minisgl minisgl
COPY judge judge
COPY tests tests
COPY classroom classroom
COPY solutions solutions
COPY notebooks notebooks
COPY judge.py ./
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
    && pip install --no-cache-dir -e .

# Not root by default would stop the pids cgroup and the namespaces; the container is the wall.
ENTRYPOINT ["python", "judge.py"]
CMD ["grade", "--help"]
