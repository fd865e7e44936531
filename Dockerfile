# Every lesson of the course in a Linux container, for machines where Triton has no
# wheels (macOS, Windows) or where you would rather not install anything.
#
#   docker build -t flash-course .
#   docker run --rm -p 8888:8888 flash-course                    # JupyterLab: open the
#                                                                # 127.0.0.1:8888 link it prints
#   docker run --rm flash-course python course.py test           # every test
#
# The image runs the course's own set-up (course.py), with the Python of the tested CPU
# set (course_utils/data/tested_versions.ini): CPU-only torch from PyTorch's CPU index
# (TORCH_INDEX=pypi uses PyPI's torch instead) and Triton through its interpreter.
# On Apple silicon the image is linux/arm64, for which torch and Triton publish wheels too.
FROM python:3.11-slim

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV COURSE_VENV=/opt/course-venv \
    COURSE_TORCH_INDEX=${TORCH_INDEX} \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1

WORKDIR /course
COPY . /course
RUN python course.py setup

EXPOSE 8888
CMD ["python", "course.py", "lab", "--ip=0.0.0.0", "--port=8888", "--no-browser"]
