"""The learning layer: MC-PILCO's GP dynamics model, particle rollouts, policy optimisation, training runs and
retraining from recorded trials. The only layer of ``mcpilco_core`` that imports torch (its modules do so at
import time, so importing this package itself stays cheap: import the modules you need)."""
