"""Feature scaling fitted on the whole data set before the split: the test score is a lie."""
import numpy as np
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

X = np.random.rand(1000, 20)
y = np.random.randint(0, 2, 1000)

scaler = StandardScaler()
X = scaler.fit_transform(X)
X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2)
