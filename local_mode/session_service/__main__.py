"""``python -m local_mode.session_service [--root DIR]``: start (or find) the local training-session
endpoint and print, as one JSON line, the variables that point an SDK or boto3 at it."""

import argparse
import json

from local_mode.session_service import start_service

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--root", default=None, help="local mode's state folder (default: $SAGEMAKER_LOCAL_ROOT)")
print(json.dumps(start_service(parser.parse_args().root).client_environment()))
